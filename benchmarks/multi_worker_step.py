"""The spanning step against TensorFlow's tutorial step on two workers of a
MultiWorkerMirroredStrategy on loopback, both with tfdtape installed.

- tutorial: tape, gradient and `apply_gradients` inside `strategy.run` (the
  optimizer all-reduces the gradients across the workers), and the loss
  reduced with `strategy.reduce` for the step to return, as TensorFlow's
  custom-training tutorial does;
- spanning: the tape around `strategy.run` and `strategy.reduce`, the
  gradient all-reduced across the workers by `tape.gradient`, applied once
  in cross-replica context.

A Keras 3 Dense stack (--layers hidden layers of 64, ReLU) and SGD, global
batch 64 split over the workers (one replica each); eager and
`tf.function`. Each sample starts a fresh cluster (two fresh processes on
fresh ports), the styles alternating; each worker times the same number of
steps (--steps, else STEPS; the workers' collectives pair up one for one)
after a warm-up step, and the sample is the slower worker's median.
Reported: the median over samples per style and mode, and spanning /
tutorial. Target: <= 1.0x.

Usage: python benchmarks/multi_worker_step.py [--samples 5] [--layers 8]
           [--modes eager tf_function] [--steps N]
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

STYLES = ("tutorial", "spanning")
MODES = ("eager", "tf_function")
WORKERS = 2
BATCH = 64
WIDTH = 64
STEPS = {"eager": 20, "tf_function": 100}
TIME_LIMIT = 300


def _worker(style, mode, layers, steps):
    """One worker of the cluster: times its steps; prints JSON."""
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf

    import tfdtape  # noqa: F401 (installs tfdtape)

    tf.get_logger().setLevel("ERROR")
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    keras = tf.keras
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((WIDTH,))] +
            [keras.layers.Dense(WIDTH, activation="relu") for _ in range(layers)] +
            [keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)
    per_worker = BATCH // WORKERS
    features = tf.random.stateless_normal((BATCH, WIDTH), seed=(1, 2))
    labels = tf.random.stateless_normal((BATCH, 1), seed=(3, 4))
    x, y = strategy.experimental_distribute_values_from_function(
        lambda context: (features[task * per_worker:(task + 1) * per_worker],
                         labels[task * per_worker:(task + 1) * per_worker]))
    variables = model.trainable_variables

    def share(x, y):
        error = model(x) - y
        return tf.nn.compute_average_loss(tf.reduce_sum(error * error, axis=1),
                                          global_batch_size=BATCH)

    def tutorial():
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                loss = share(x, y)
            optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
            return loss
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, y)), axis=None)

    def spanning():
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", strategy.run(share, args=(x, y)), axis=None)
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    step = tutorial if style == "tutorial" else spanning
    if mode == "tf_function":
        step = tf.function(step)
    times = []
    with strategy.scope():
        step()  # warm-up: the trace, or the first eager step
        for _ in range(steps or STEPS[mode]):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    print(json.dumps({"step": statistics.median(times)}))


def _free_ports(count):
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


def _sample(style, mode, layers, steps):
    """The slower worker's median step time of one fresh cluster."""
    cluster = {"worker": [f"127.0.0.1:{port}" for port in _free_ports(WORKERS)]}
    processes = []
    try:
        for index in range(WORKERS):
            environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_CONFIG=json.dumps(
                {"cluster": cluster, "task": {"type": "worker", "index": index}}))
            processes.append(subprocess.Popen(
                [sys.executable, __file__, "--worker", style, mode,
                 "--layers", str(layers), "--steps", str(steps)],
                env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True))
        medians = []
        for process in processes:
            out, err = process.communicate(timeout=TIME_LIMIT)
            if process.returncode != 0:
                raise RuntimeError(f"a {style} worker failed:\n{err[-2000:]}")
            medians.append(json.loads(out.strip().splitlines()[-1])["step"])
        return max(medians)
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
                        help="timed steps per worker (default: 20 eager, 100 traced)")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(*args.worker, args.layers, args.steps)
        return
    rows = []
    for mode in args.modes:
        found = {style: [] for style in STYLES}
        for index in range(args.samples):
            order = STYLES if index % 2 == 0 else STYLES[::-1]
            for style in order:
                found[style].append(_sample(style, mode, args.layers, args.steps))
            print(f"{mode} sample {index + 1}/{args.samples}: " + "  ".join(
                f"{s} {found[s][-1] * 1000:.2f} ms" for s in STYLES),
                file=sys.stderr, flush=True)
        rows.append((mode, {style: statistics.median(times)
                            for style, times in found.items()}))
    print(f"Dense model, {args.layers} hidden layers of {WIDTH}, global batch {BATCH}, "
          f"{WORKERS} workers on loopback (one replica each), tfdtape installed; "
          f"{args.samples} fresh clusters per style and mode, median step time (ms)")
    print(f"{'mode':12} {'tutorial':>10} {'spanning':>10} {'spanning/tutorial':>18}")
    for mode, medians in rows:
        ratio = medians["spanning"] / medians["tutorial"]
        print(f"{mode:12} {medians['tutorial'] * 1000:10.2f} "
              f"{medians['spanning'] * 1000:10.2f} {ratio:17.3f}x "
              f"{'ok' if ratio <= 1.0 else 'OVER TARGET'}")


if __name__ == "__main__":
    main()
