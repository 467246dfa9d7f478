"""The tape around strategy.run against TensorFlow's tutorial step, both with
tfdtape installed: the time of a training step on the same model.

- canonical: tape, gradient and `apply_gradients` inside `strategy.run`
  (the optimizer all-reduces the gradients and applies per replica);
- spanning: the tape around `strategy.run` and `strategy.reduce`, the
  gradient (the total over the replicas) and `apply_gradients` in
  cross-replica context (summed once, applied once).

The matrix: MirroredStrategy over 2, 4 and 8 virtual CPUs x a Dense stack of
8 and 128 hidden layers (18 and 258 variables) x eager and `tf.function`.
`--model sync_bn` puts a synchronized BatchNormalization after each hidden
Dense layer (Keras 3's `BatchNormalization(synchronized=True)`: every
replica's batch statistics all-reduced in the forward pass; the spanning
step differentiates those all-reduces over every replica,
`tfdtape.collectives`).
Each sample runs in a fresh process (tracing slows with every function a
process has traced), styles alternating; a sample times steps for about
--seconds after a warm-up step (at least 3, at most STEPS). Reported are the
medians and the ratio spanning / canonical per cell. Target: <= 1.0x in
every cell.

Usage: python benchmarks/spanning_step.py [--samples 3] [--replicas 2 4 8]
           [--layers 8 128] [--modes eager tf_function] [--seconds 2]
           [--model dense|sync_bn]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

STYLES = ("canonical", "spanning")
STEPS = {"eager": 20, "tf_function": 100}
MIN_STEPS = 3
BATCH = 64
WIDTH = 64


MODELS = ("dense", "sync_bn")


def _hidden(keras, model_kind):
    """One hidden layer's layers: Dense with ReLU, or Dense, synchronized
    BatchNormalization, ReLU."""
    if model_kind == "dense":
        return [keras.layers.Dense(WIDTH, activation="relu")]
    return [keras.layers.Dense(WIDTH), keras.layers.BatchNormalization(synchronized=True),
            keras.layers.ReLU()]


def _child(style, replicas, mode, layers, seconds, model_kind):
    """Times steps of one style in this (fresh) process; prints JSON."""
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf

    import tfdtape  # noqa: F401 (installs tfdtape)
    from tfdtape import testing

    tf.get_logger().setLevel("ERROR")
    strategy = tf.distribute.MirroredStrategy(testing.virtual_cpus(replicas))
    keras = tf.keras
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((WIDTH,))] +
            [layer for _ in range(layers) for layer in _hidden(keras, model_kind)] +
            [keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)
    dataset = tf.data.Dataset.from_tensor_slices((
        tf.random.stateless_normal((BATCH, WIDTH), seed=(1, 2)),
        tf.random.stateless_normal((BATCH, 1), seed=(3, 4)))).batch(BATCH).repeat()
    features, labels = next(iter(strategy.experimental_distribute_dataset(dataset)))
    variables = model.trainable_variables

    def share(x, y):
        error = model(x, training=True) - y
        return tf.nn.compute_average_loss(tf.reduce_sum(error * error, axis=1),
                                          global_batch_size=BATCH)

    def canonical():
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                loss = share(x, y)
            gradients = tape.gradient(loss, variables)
            optimizer.apply_gradients(zip(gradients, variables))
        strategy.run(replica_step, args=(features, labels))

    def spanning():
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", strategy.run(share, args=(features, labels)),
                                   axis=None)
        gradients = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(gradients, variables))

    step = canonical if style == "canonical" else spanning
    if mode == "tf_function":
        step = tf.function(step)
    times = []
    with strategy.scope():
        step()  # warm-up: the trace, or the first eager step
        began = time.perf_counter()
        while len(times) < STEPS[mode] and (
                len(times) < MIN_STEPS or time.perf_counter() - began < seconds):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    print(json.dumps({"step": statistics.median(times)}))


def _sample(style, replicas, mode, layers, seconds, model_kind):
    completed = subprocess.run(
        [sys.executable, __file__, "--child", style, str(replicas), mode,
         "--layers", str(layers), "--seconds", str(seconds), "--model", model_kind],
        capture_output=True, text=True, check=False,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    if completed.returncode != 0:
        raise RuntimeError(f"the {style} sample failed:\n{completed.stderr[-2000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])["step"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--replicas", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--layers", type=int, nargs="+", default=[8, 128])
    parser.add_argument("--modes", nargs="+", choices=tuple(STEPS),
                        default=list(STEPS))
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--model", choices=MODELS, default="dense")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        style, replicas, mode = args.child
        _child(style, int(replicas), mode, args.layers[0], args.seconds, args.model)
        return
    rows = []
    for layers in args.layers:
        for replicas in args.replicas:
            for mode in args.modes:
                found = {style: [] for style in STYLES}
                for index in range(args.samples):
                    order = STYLES if index % 2 == 0 else STYLES[::-1]
                    for style in order:
                        found[style].append(
                            _sample(style, replicas, mode, layers, args.seconds,
                                    args.model))
                    print(f"{layers} layers, MirroredStrategy({replicas}) {mode} "
                          f"sample {index + 1}/{args.samples}: " + "  ".join(
                              f"{s} {found[s][-1] * 1000:.2f} ms" for s in STYLES),
                          file=sys.stderr, flush=True)
                medians = {style: statistics.median(times)
                           for style, times in found.items()}
                rows.append((layers, replicas, mode, medians))
    described = ("Dense model" if args.model == "dense" else
                 "Dense + synchronized BatchNormalization model")
    print(f"{described}, hidden layers of {WIDTH}, global batch {BATCH}, tfdtape "
          f"installed; {args.samples} fresh processes per cell and style, median "
          "step time (ms)")
    print(f"{'layers':>6} {'strategy':22} {'mode':12} {'canonical':>10} "
          f"{'spanning':>10} {'spanning/canonical':>19}")
    for layers, replicas, mode, medians in rows:
        ratio = medians["spanning"] / medians["canonical"]
        print(f"{layers:6d} {'MirroredStrategy(' + str(replicas) + ')':22} {mode:12} "
              f"{medians['canonical'] * 1000:10.2f} {medians['spanning'] * 1000:10.2f} "
              f"{ratio:18.3f}x {'ok' if ratio <= 1.0 else 'OVER TARGET'}")


if __name__ == "__main__":
    main()
