"""Per-call cost of tfdtape's hot paths against stock TensorFlow, side by side.

Measures, in one process and interleaved (each repeat runs every
configuration once, in turn), the median over repeats of:
- `tape.variable_accessed(v)` and `GradientTape.watch(v)` with no strategy,
- the same in replica context under MirroredStrategy(4), for the replica's
  component (what a read hands the tape) and for the container,
- one eager MirroredStrategy(4) training step.
for three configurations: the floor (no resolver at all: TensorFlow before the
commit), stock TensorFlow (its native resolver), and tfdtape as users run it.
Prints microseconds and the ratios the targets are stated in:
no strategy: tfdtape <= 1.3x floor; replica context: tfdtape <= 1.0x stock;
training step: tfdtape <= 1.02x stock.

Usage: python benchmarks/overhead.py [--repeats 7] [--calls 20000] [--steps 30]
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TFDTAPE_AUTOINSTALL", "0")

import tensorflow as tf
from tensorflow.python.eager import tape as tape_module

from tfdtape import testing

CONFIGURATIONS = {"floor": "pre_seed", "stock": "stock", "tfdtape": "tfdtape"}
REPLICAS = 4


def per_call(function, calls):
    """Seconds per call of function(), timed over `calls` calls in a tape."""
    with tf.GradientTape():
        start = time.perf_counter()
        for _ in range(calls):
            function()
        return (time.perf_counter() - start) / calls


def in_replicas(strategy, make_function, calls):
    """Seconds per call, each replica calling make_function(replica_id, tape)()."""
    def replica_fn():
        replica_id = tf.get_static_value(
            tf.distribute.get_replica_context().replica_id_in_sync_group)
        with tf.GradientTape() as tape:
            function = make_function(int(replica_id), tape)
            for _ in range(calls):
                function()
    start = time.perf_counter()
    strategy.run(replica_fn)
    return (time.perf_counter() - start) / (calls * REPLICAS)


def training_step(strategy, kernel, optimizer, features):
    """One eager step: forward, gradient, all-reduce and update on each replica."""
    def replica_fn():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(features, kernel) ** 2)
        gradients = tape.gradient(loss, [kernel])
        optimizer.apply_gradients(zip(gradients, [kernel]))
    strategy.run(replica_fn)


def measurements(strategy, calls, steps):
    """name -> zero-argument callable returning seconds per operation."""
    plain = tf.Variable(1.0)
    with strategy.scope():
        mirrored = tf.Variable(1.0)
        kernel = tf.Variable(tf.ones([8, 8]))
        optimizer = tf.keras.optimizers.SGD(0.01)
    features = tf.ones([4, 8])
    training_step(strategy, kernel, optimizer, features)  # build the optimizer
    watch_tape = tf.GradientTape()

    def step_time():
        start = time.perf_counter()
        for _ in range(steps):
            training_step(strategy, kernel, optimizer, features)
        return (time.perf_counter() - start) / steps

    def watch(variable):
        with watch_tape:
            return per_call(lambda: watch_tape.watch(variable), calls)

    return {
        "no strategy: variable_accessed": lambda: per_call(
            lambda: tape_module.variable_accessed(plain), calls),
        "no strategy: GradientTape.watch": lambda: watch(plain),
        "replica: variable_accessed(component)": lambda: in_replicas(
            strategy, lambda i, tape: lambda: tape_module.variable_accessed(
                mirrored.values[i]), calls // REPLICAS),
        "replica: variable_accessed(container)": lambda: in_replicas(
            strategy, lambda i, tape: lambda: tape_module.variable_accessed(
                mirrored), calls // REPLICAS),
        "replica: GradientTape.watch(container)": lambda: in_replicas(
            strategy, lambda i, tape: lambda: tape.watch(mirrored),
            calls // REPLICAS),
        "eager training step, MirroredStrategy(4)": step_time,
    }


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.calls < REPLICAS or args.steps < 1:
        parser.error("--repeats and --steps must be >= 1, --calls >= 4")
    strategy = tf.distribute.MirroredStrategy(testing.virtual_cpus(REPLICAS))
    cases = measurements(strategy, args.calls, args.steps)
    samples = {(case, config): [] for case in cases for config in CONFIGURATIONS}
    for _ in range(args.repeats):
        for case, measure in cases.items():
            for config, configuration in CONFIGURATIONS.items():
                with testing.configuration(configuration):
                    samples[case, config].append(measure())
    print(f"TensorFlow {tf.__version__}, Python {sys.version.split()[0]}, "
          f"median of {args.repeats} interleaved repeats, microseconds per call")
    header = (f"{'case':44} {'floor':>8} {'stock':>8} {'tfdtape':>8}  "
              f"{'tfdtape/floor':>13} {'tfdtape/stock':>13}")
    print(header)
    for case in cases:
        median = {config: statistics.median(samples[case, config]) * 1e6
                  for config in CONFIGURATIONS}
        print(f"{case:44} {median['floor']:8.2f} {median['stock']:8.2f} "
              f"{median['tfdtape']:8.2f}  {median['tfdtape'] / median['floor']:12.2f}x "
              f"{median['tfdtape'] / median['stock']:12.2f}x")


if __name__ == "__main__":
    main(sys.argv[1:])
