"""What `python -m tfdtape run`'s end-of-run check of mirrored copies costs:
the time of `EventCounts.check_copies()` (every copy of every mirrored
variable the recorder saw read to the host and compared) against the time of
one training step of the same model, in one process.

The model is a stack of Dense layers (2 variables each) under
MirroredStrategy over virtual CPUs, trained by the tutorial step in a
`tf.function` with the recorder open; then the step and the check are timed
in interleaved rounds. Reported: the medians and the check's cost in steps.
The check runs once per `tfdtape run`, so its cost is paid once, not per step.

Usage: python benchmarks/copies_check.py [--replicas 4] [--layers 128] [--rounds 15]
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf

import tfdtape  # noqa: F401 (installs tfdtape)
from tfdtape import events
from tfdtape import testing
from tfdtape.cli import event_counts


def build(replicas, layers, width):
    """(one traced training step, the recorder that saw it, the model)."""
    strategy = testing.mirrored_strategy(replicas)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((width,))] + [
            tf.keras.layers.Dense(width, activation="tanh") for _ in range(layers)])
        optimizer = tf.keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)
    features = tf.random.stateless_normal((8 * replicas, width), seed=(1, 2))
    batches = iter(strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensors(features).repeat()))

    def replica_step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(x) ** 2)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))

    @tf.function
    def step():
        strategy.run(replica_step, args=(next(batches),))

    recorder = event_counts.EventCounts()
    events.open_sink(recorder)
    step()
    return step, recorder, model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--layers", type=int, default=128)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    step, recorder, model = build(args.replicas, args.layers, args.width)
    seconds = {"step": [], "check": []}
    for index in range(args.rounds):
        for name in (("step", "check") if index % 2 == 0 else ("check", "step")):
            start = time.perf_counter()
            step() if name == "step" else recorder.check_copies()
            seconds[name].append(time.perf_counter() - start)
    if recorder.snapshot()["warnings"]:
        raise RuntimeError("a healthy run was warned")
    # The check compared every variable: one copy moved is found.
    model.trainable_variables[-1].value.values[-1].assign_add(
        tf.ones_like(model.trainable_variables[-1]))
    recorder.check_copies()
    if len(recorder.snapshot()["warnings"]) != 1:
        raise RuntimeError("the moved copy was not found")
    step_time, check_time = (statistics.median(seconds[name]) for name in seconds)
    variables = 2 * args.layers
    print(f"MirroredStrategy({args.replicas}), {args.layers} Dense({args.width}) "
          f"layers ({variables} variables), tf.function tutorial step; "
          f"medians of {args.rounds} rounds")
    print(f"step {step_time * 1e3:.1f} ms  check_copies {check_time * 1e3:.1f} ms "
          f"({check_time / variables * 1e6:.0f} us per variable)  "
          f"check / step {check_time / step_time:.2f}")


if __name__ == "__main__":
    main()
