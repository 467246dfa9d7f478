"""The tape around strategy.run against TensorFlow's tutorial step, both with
tfdtape installed: the time of a training step on the same model.

- canonical: tape, gradient and `apply_gradients` inside `strategy.run`
  (the optimizer all-reduces the gradients and applies per replica);
- spanning: the tape around `strategy.run` and `strategy.reduce`, the
  gradient (the total over the replicas) and `apply_gradients` in
  cross-replica context (summed once, applied once);
- stock (with --stock): the canonical step in a process that never imports
  tfdtape, stock TensorFlow's tutorial step.

The matrix: MirroredStrategy over 2, 4 and 8 virtual CPUs x a Dense stack of
8 and 128 hidden layers (18 and 258 variables) x eager and `tf.function`;
hidden layers of --width (64), a global batch of --batch (64), or of
--batch-per-replica times the replicas (the narrow model where per-op
overhead dominates: --width 16 --batch-per-replica 8).
`--model sync_bn` puts a synchronized BatchNormalization after each hidden
Dense layer (Keras 3's `BatchNormalization(synchronized=True)`: every
replica's batch statistics all-reduced in the forward pass; the spanning
step differentiates those all-reduces over every replica,
`tfdtape.collectives`).
Each sample runs in a fresh process (tracing slows with every function a
process has traced), styles alternating; a sample times steps for about
--seconds after a warm-up step (at least 3, at most STEPS). Reported are the
medians and the ratio spanning / canonical per cell (and spanning /
stock). Target: <= 1.0x in every cell.

In `tf.function` each style's first call also counts the ops of the graphs
TensorFlow partitioned the step into, by device (what runs, after Grappler
and placement): the table gives each style's op count and its transfers
between devices (`_Send`), and --op-counts lists per cell the op types
whose counts differ between the styles.

Usage: python benchmarks/spanning_step.py [--samples 3] [--replicas 2 4 8]
           [--layers 8 128] [--modes eager tf_function] [--seconds 2]
           [--model dense|sync_bn] [--width 64]
           [--batch 64 | --batch-per-replica 8] [--stock] [--op-counts]
"""

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time

STYLES = ("canonical", "spanning")
STOCK = "stock"
STEPS = {"eager": 20, "tf_function": 100}
MIN_STEPS = 3


MODELS = ("dense", "sync_bn")


def _hidden(keras, model_kind, width):
    """One hidden layer's layers: Dense with ReLU, or Dense, synchronized
    BatchNormalization, ReLU."""
    if model_kind == "dense":
        return [keras.layers.Dense(width, activation="relu")]
    return [keras.layers.Dense(width), keras.layers.BatchNormalization(synchronized=True),
            keras.layers.ReLU()]


def _partitioned_ops(tf, step):
    """Calls `step` (a tf.function, first call) collecting the graphs
    TensorFlow runs it as: {op type: count} over every device's partition."""
    from tensorflow.python.eager import context

    runtime = context.context()
    runtime.enable_graph_collection()
    try:
        step()
        collected = runtime.export_run_metadata()
    finally:
        runtime.disable_graph_collection()
    return dict(collections.Counter(
        node.op for graphs in collected.function_graphs
        for partition in graphs.partition_graphs for node in partition.node))


def _child(style, replicas, mode, options):
    """Times steps of one style in this (fresh) process; prints JSON: the
    median step time and, in a tf.function, the partitioned graphs' op
    counts."""
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf

    if style != STOCK:
        import tfdtape  # noqa: F401 (installs tfdtape)
    from tfdtape import testing

    tf.get_logger().setLevel("ERROR")
    width, batch = options.width, _global_batch(options, replicas)
    strategy = tf.distribute.MirroredStrategy(testing.virtual_cpus(replicas))
    keras = tf.keras
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((width,))] +
            [layer for _ in range(options.layers[0])
             for layer in _hidden(keras, options.model, width)] +
            [keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)
    dataset = tf.data.Dataset.from_tensor_slices((
        tf.random.stateless_normal((batch, width), seed=(1, 2)),
        tf.random.stateless_normal((batch, 1), seed=(3, 4)))).batch(batch).repeat()
    features, labels = next(iter(strategy.experimental_distribute_dataset(dataset)))
    variables = model.trainable_variables

    def share(x, y):
        error = model(x, training=True) - y
        return tf.nn.compute_average_loss(tf.reduce_sum(error * error, axis=1),
                                          global_batch_size=batch)

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

    step = canonical if style != "spanning" else spanning
    ops = None
    times = []
    with strategy.scope():
        if mode == "tf_function":
            step = tf.function(step)
            ops = _partitioned_ops(tf, step)  # warm-up: the trace
        else:
            step()  # warm-up: the first eager step
        began = time.perf_counter()
        while len(times) < STEPS[mode] and (
                len(times) < MIN_STEPS or time.perf_counter() - began < options.seconds):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    print(json.dumps({"step": statistics.median(times), "ops": ops}))


def _global_batch(options, replicas):
    return (options.batch_per_replica * replicas if options.batch_per_replica
            else options.batch)


def _sample(style, replicas, mode, layers, options):
    """One fresh process's {"step": seconds, "ops": counts or None}."""
    batch = (["--batch-per-replica", str(options.batch_per_replica)]
             if options.batch_per_replica else ["--batch", str(options.batch)])
    completed = subprocess.run(
        [sys.executable, __file__, "--child", style, str(replicas), mode,
         "--layers", str(layers), "--seconds", str(options.seconds),
         "--model", options.model, "--width", str(options.width), *batch],
        capture_output=True, text=True, check=False,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    if completed.returncode != 0:
        raise RuntimeError(f"the {style} sample failed:\n{completed.stderr[-2000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def _op_differences(ops):
    """'Type: canonical/spanning[/stock]' for each op type whose count
    differs between the styles (`ops`: style -> {op type: count})."""
    types = sorted(set().union(*ops.values()))
    return ", ".join(
        f"{op} " + "/".join(str(ops[style].get(op, 0)) for style in ops)
        for op in types if len({ops[style].get(op, 0) for style in ops}) > 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--replicas", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--layers", type=int, nargs="+", default=[8, 128])
    parser.add_argument("--modes", nargs="+", choices=tuple(STEPS),
                        default=list(STEPS))
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--model", choices=MODELS, default="dense")
    parser.add_argument("--width", type=int, default=64)
    batches = parser.add_mutually_exclusive_group()
    batches.add_argument("--batch", type=int, default=64,
                         help="the global batch (default 64)")
    batches.add_argument("--batch-per-replica", type=int,
                         help="the batch per replica (the global batch grows "
                              "with the replicas)")
    parser.add_argument("--stock", action="store_true",
                        help="also time stock TensorFlow's tutorial step "
                             "(tfdtape never imported)")
    parser.add_argument("--op-counts", action="store_true",
                        help="list the op types whose counts differ per cell")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.width < 1 or (args.batch_per_replica or args.batch) < 1 or args.samples < 1:
        parser.error("--width, the batch and --samples must be at least 1")
    if args.child:
        style, replicas, mode = args.child
        _child(style, int(replicas), mode, args)
        return
    styles = STYLES + ((STOCK,) if args.stock else ())
    rows = []
    for layers in args.layers:
        for replicas in args.replicas:
            for mode in args.modes:
                found = {style: [] for style in styles}
                ops = {}
                for index in range(args.samples):
                    order = styles if index % 2 == 0 else styles[::-1]
                    for style in order:
                        sample = _sample(style, replicas, mode, layers, args)
                        found[style].append(sample["step"])
                        ops[style] = sample["ops"]
                    print(f"{layers} layers, MirroredStrategy({replicas}) {mode} "
                          f"sample {index + 1}/{args.samples}: " + "  ".join(
                              f"{s} {found[s][-1] * 1000:.2f} ms" for s in styles),
                          file=sys.stderr, flush=True)
                medians = {style: statistics.median(times)
                           for style, times in found.items()}
                rows.append((layers, replicas, mode, medians, ops))
    _print_table(args, styles, rows)


def _print_table(args, styles, rows):
    described = ("Dense model" if args.model == "dense" else
                 "Dense + synchronized BatchNormalization model")
    batch = (f"batch {args.batch_per_replica} per replica" if args.batch_per_replica
             else f"global batch {args.batch}")
    print(f"{described}, hidden layers of {args.width}, {batch}; tfdtape installed "
          f"{'(stock: not imported)' if args.stock else 'in both'}; {args.samples} fresh "
          "processes per cell and style, median step time (ms); in a tf.function "
          "each style's partitioned ops and transfers (_Send)")
    header = (f"{'layers':>6} {'strategy':22} {'mode':12} " +
              " ".join(f"{style:>10}" for style in styles) +
              f" {'spanning/canonical':>19}" +
              (f" {'spanning/stock':>15}" if args.stock else "") + "  ops (transfers)")
    print(header)
    for layers, replicas, mode, medians, ops in rows:
        ratios = [medians["spanning"] / medians["canonical"]]
        if args.stock:
            ratios.append(medians["spanning"] / medians[STOCK])
        counted = ("  " + " ".join(
            f"{sum(ops[style].values())} ({ops[style].get('_Send', 0)})"
            for style in styles) if mode == "tf_function" else "")
        print(f"{layers:6d} {'MirroredStrategy(' + str(replicas) + ')':22} {mode:12} " +
              " ".join(f"{medians[style] * 1000:10.2f}" for style in styles) +
              f" {ratios[0]:18.3f}x" +
              (f" {ratios[1]:14.3f}x" if args.stock else "") +
              f" {'ok' if max(ratios) <= 1.0 else 'OVER TARGET'}{counted}")
        if args.op_counts and mode == "tf_function":
            print(f"{'':6} op types that differ ({'/'.join(styles)}): "
                  f"{_op_differences(ops) or 'none'}")


if __name__ == "__main__":
    main()
