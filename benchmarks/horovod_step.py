"""tfdtape.horovod's DistributedGradientTape step against TensorFlow's
MultiWorkerMirroredStrategy tutorial step, on the same model and processes.

- mwms: stock TensorFlow (tfdtape never imported), TensorFlow's
  multi-worker custom-training tutorial: tape, gradient and
  `apply_gradients` inside `strategy.run` (the optimizer all-reduces the
  gradients across the workers);
- horovod: a Horovod program on `tfdtape.horovod`: `hvd.init()`, the tape
  around the local loss (the worker's mean), `hvd.DistributedGradientTape`
  (the average over the workers, fused), `apply_gradients`.

A Keras 3 Dense stack (--layers hidden layers of 64, ReLU) and SGD, global
batch 64 split over the workers (one process each, on loopback); eager and
`tf.function`. Each sample starts two fresh processes on fresh ports, the
styles alternating; each times the same number of steps after a warm-up
step, and the sample is the slower process's median. Reported: the median
over samples per style and mode, horovod / mwms, and, in a `tf.function`,
the collectives one step issues (the traced graph's collective ops).
Target: <= 1.0x. With --batch-norm, each hidden layer is followed by a
synchronized BatchNormalization, trained: Keras's `synchronized=True` under
the strategy, `hvd.SyncBatchNormalization` under tfdtape.horovod (the
statistics of the global batch either way).

Usage: python benchmarks/horovod_step.py [--samples 5] [--layers 8]
           [--modes eager tf_function] [--steps N] [--batch-norm]
"""

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time

STYLES = ("mwms", "horovod")
MODES = ("eager", "tf_function")
WORKERS = 2
BATCH = 64
WIDTH = 64
STEPS = {"eager": 20, "tf_function": 100}
TIME_LIMIT = 300


def _collectives(step):
    """Collective ops in the graph of a traced step."""
    graph = step.get_concrete_function().graph
    return sum(op.type.startswith("Collective") for op in graph.get_operations())


def _hidden(keras, style, batch_norm):
    """One hidden layer: Dense, then (with `batch_norm`) the style's
    synchronized BatchNormalization."""
    dense = [keras.layers.Dense(WIDTH, activation="relu")]
    if not batch_norm:
        return dense
    if style == "horovod":
        import tfdtape.horovod as hvd
        return dense + [hvd.SyncBatchNormalization()]
    return dense + [keras.layers.BatchNormalization(synchronized=True)]


def _worker(style, mode, layers, steps, batch_norm):
    """One process of the job: times its steps; prints JSON."""
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    if style == "horovod":
        import tfdtape.horovod as hvd

        hvd.init()
        scope = contextlib.nullcontext
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        scope = strategy.scope
    keras = tf.keras
    with scope():
        model = keras.Sequential(
            [keras.Input((WIDTH,))] +
            [layer for _ in range(layers) for layer in _hidden(keras, style, batch_norm)] +
            [keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)
    per_worker = BATCH // WORKERS
    features = tf.random.stateless_normal((BATCH, WIDTH), seed=(1, 2))
    labels = tf.random.stateless_normal((BATCH, 1), seed=(3, 4))
    rows = slice(task * per_worker, (task + 1) * per_worker)
    variables = model.trainable_variables

    if style == "horovod":
        x, y = features[rows], labels[rows]

        def step():
            with tf.GradientTape() as tape:
                error = model(x, training=True) - y
                loss = tf.reduce_mean(tf.reduce_sum(error * error, axis=1))
            tape = hvd.DistributedGradientTape(tape)
            optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
            return loss
    else:
        x, y = strategy.experimental_distribute_values_from_function(
            lambda context: (features[rows], labels[rows]))

        def step():
            def replica_step(x, y):
                with tf.GradientTape() as tape:
                    error = model(x, training=True) - y
                    loss = tf.nn.compute_average_loss(
                        tf.reduce_sum(error * error, axis=1), global_batch_size=BATCH)
                optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
                return loss
            return strategy.reduce("SUM", strategy.run(replica_step, args=(x, y)),
                                   axis=None)

    collectives = None
    if mode == "tf_function":
        step = tf.function(step)
    times = []
    with scope():
        step()  # warm-up: the trace, or the first eager step
        if mode == "tf_function":
            collectives = _collectives(step)
        for _ in range(steps or STEPS[mode]):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    print(json.dumps({"step": statistics.median(times), "collectives": collectives}))


def _free_ports(count):
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


def _sample(style, mode, layers, steps, batch_norm):
    """(the slower process's median step time, collectives per step) of one
    fresh job."""
    cluster = {"worker": [f"127.0.0.1:{port}" for port in _free_ports(WORKERS)]}
    processes = []
    try:
        for index in range(WORKERS):
            environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_CONFIG=json.dumps(
                {"cluster": cluster, "task": {"type": "worker", "index": index}}))
            processes.append(subprocess.Popen(
                [sys.executable, __file__, "--worker", style, mode,
                 "--layers", str(layers), "--steps", str(steps)]
                + (["--batch-norm"] if batch_norm else []),
                env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True))
        results = []
        for process in processes:
            out, err = process.communicate(timeout=TIME_LIMIT)
            if process.returncode != 0:
                raise RuntimeError(f"a {style} process failed:\n{err[-2000:]}")
            results.append(json.loads(out.strip().splitlines()[-1]))
        return max(r["step"] for r in results), results[0]["collectives"]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--steps", type=int, default=0,
                        help="timed steps per process (default: 20 eager, 100 traced)")
    parser.add_argument("--batch-norm", action="store_true",
                        help="a synchronized BatchNormalization after each hidden layer")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(*args.worker, args.layers, args.steps, args.batch_norm)
        return
    if args.samples < 1 or args.layers < 0 or args.steps < 0:
        parser.error("--samples must be at least 1, --layers and --steps at least 0")
    rows = []
    for mode in args.modes:
        found = {style: [] for style in STYLES}
        collectives = {}
        for index in range(args.samples):
            order = STYLES if index % 2 == 0 else STYLES[::-1]
            for style in order:
                seconds, collectives[style] = _sample(style, mode, args.layers, args.steps,
                                                      args.batch_norm)
                found[style].append(seconds)
            print(f"{mode} sample {index + 1}/{args.samples}: " + "  ".join(
                f"{s} {found[s][-1] * 1000:.2f} ms" for s in STYLES),
                file=sys.stderr, flush=True)
        rows.append((mode, {style: statistics.median(times)
                            for style, times in found.items()}, collectives))
    print(f"Dense model, {args.layers} hidden layers of {WIDTH}"
          f"{' each with a synchronized BatchNormalization' if args.batch_norm else ''}, "
          f"global batch {BATCH}, "
          f"{WORKERS} processes on loopback; {args.samples} fresh jobs per style and "
          "mode, median step time (ms); collectives per traced step")
    print(f"{'mode':12} {'mwms':>10} {'horovod':>10} {'horovod/mwms':>13}  collectives")
    for mode, medians, collectives in rows:
        ratio = medians["horovod"] / medians["mwms"]
        counted = (f"  {collectives['mwms']} / {collectives['horovod']}"
                   if mode == "tf_function" else "")
        print(f"{mode:12} {medians['mwms'] * 1000:10.2f} "
              f"{medians['horovod'] * 1000:10.2f} {ratio:12.3f}x "
              f"{'ok' if ratio <= 1.0 else 'OVER TARGET'}{counted}")


if __name__ == "__main__":
    main()
