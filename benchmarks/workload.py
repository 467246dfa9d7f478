"""Whole-step cost of tfdtape against stock TensorFlow: tracing, steady state,
eager steps, on a deep Keras model under MirroredStrategy(2).

Tracing gets slower with every `tf.function` a process has traced, so an
in-process A/B comparison favours whichever configuration runs first. Each
sample therefore runs in a fresh process, and the configurations alternate
(their order rotates from one round of samples to the next). Reported are the
medians over samples and the ratios to stock TensorFlow.

Configurations: stock (tfdtape not installed), tfdtape (installed), and
tfdtape with a `tfdtape.trace()` open for the whole run. Each sample measures:
- trace: the first call of a fresh `tf.function` train step (tracing it, and
  running it once);
- steady: the median time of a later call of that step;
- eager: the median time of an eager train step (no `tf.function`).

Targets: tracing, steady state and eager <= 1.02x stock; with a trace open
<= 1.05x.

Usage: python benchmarks/workload.py [--samples 6] [--layers 60]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CONFIGURATIONS = ("stock", "tfdtape", "tfdtape+trace")
MEASURES = ("trace", "steady", "eager")
STEADY_CALLS = 30
EAGER_STEPS = 5
REPLICAS = 2
BATCH = 8
WIDTH = 8


def _child(configuration, layers):
    """Measures one sample in this (fresh) process; prints it as JSON."""
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    os.environ["TFDTAPE_AUTOINSTALL"] = "0"
    import contextlib

    import tensorflow as tf

    import tfdtape
    from tfdtape import testing

    strategy = tf.distribute.MirroredStrategy(testing.virtual_cpus(REPLICAS))
    tf.get_logger().setLevel("ERROR")
    if configuration != "stock":
        tfdtape.install()
    recording = (tfdtape.trace() if configuration == "tfdtape+trace"
                 else contextlib.nullcontext())
    keras = tf.keras
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((WIDTH,))] +
            [keras.layers.Dense(WIDTH, activation="tanh") for _ in range(layers)] +
            [keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.01)
    assert len(model.trainable_variables) == 2 * (layers + 1)
    features = tf.random.stateless_normal((BATCH, WIDTH), seed=(1, 2))
    labels = tf.random.stateless_normal((BATCH, 1), seed=(3, 4))

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    def eager_step():
        return strategy.run(replica_step, args=(features, labels))

    traced_step = tf.function(eager_step)
    with recording:
        eager_step()  # builds the optimizer's variables outside the timings
        start = time.perf_counter()
        traced_step()
        trace_seconds = time.perf_counter() - start
        steady = []
        for _ in range(STEADY_CALLS):
            start = time.perf_counter()
            traced_step()
            steady.append(time.perf_counter() - start)
        eager = []
        for _ in range(EAGER_STEPS):
            start = time.perf_counter()
            eager_step()
            eager.append(time.perf_counter() - start)
    print(json.dumps({"trace": trace_seconds, "steady": statistics.median(steady),
                      "eager": statistics.median(eager),
                      "variables": len(model.trainable_variables)}))


def _sample(configuration, layers):
    """Runs one sample in a fresh process; returns its measurements."""
    completed = subprocess.run(
        [sys.executable, __file__, "--child", configuration, "--layers",
         str(layers)], capture_output=True, text=True, check=False,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    if completed.returncode != 0:
        raise RuntimeError(f"the {configuration} sample failed:\n"
                           f"{completed.stderr[-2000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=6)
    parser.add_argument("--layers", type=int, default=60,
                        help="hidden Dense layers (2 variables each)")
    parser.add_argument("--child", choices=CONFIGURATIONS,
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.layers)
        return
    found = {configuration: [] for configuration in CONFIGURATIONS}
    variables = None
    for index in range(args.samples):
        shift = index % len(CONFIGURATIONS)
        for configuration in CONFIGURATIONS[shift:] + CONFIGURATIONS[:shift]:
            sample = _sample(configuration, args.layers)
            variables = sample["variables"]
            found[configuration].append(sample)
            print(f"sample {index + 1}/{args.samples} {configuration:14} "
                  + "  ".join(f"{m} {sample[m] * 1000:9.1f} ms" for m in MEASURES),
                  file=sys.stderr, flush=True)
    medians = {configuration: {m: statistics.median(s[m] for s in samples)
                               for m in MEASURES}
               for configuration, samples in found.items()}
    print(f"Keras model with {variables} trainable variables, "
          f"MirroredStrategy({REPLICAS}), {args.samples} fresh processes per "
          "configuration, medians (ms)")
    print(f"{'measure':8} {'stock':>10} {'tfdtape':>10} {'+trace':>10} "
          f"{'tfdtape/stock':>14} {'+trace/stock':>13}")
    for measure in MEASURES:
        stock = medians["stock"][measure]
        plain = medians["tfdtape"][measure]
        traced = medians["tfdtape+trace"][measure]
        print(f"{measure:8} {stock * 1000:10.1f} {plain * 1000:10.1f} "
              f"{traced * 1000:10.1f} {plain / stock:13.3f}x "
              f"{traced / stock:12.3f}x")


if __name__ == "__main__":
    main()
