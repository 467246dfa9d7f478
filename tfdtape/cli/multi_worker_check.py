"""`verify --multi-worker`: the spanning step on two worker processes.

The check starts two workers of a MultiWorkerMirroredStrategy cluster on
loopback (fresh ports; both killed past `TIME_LIMIT` seconds), in the
configuration verify is observing (`tfdtape.testing`: read from whether
tfdtape is installed and TensorFlow's resolver registered, and set up the
same way in each worker). Each worker holds one replica, whose input is
x = task + 1; a tape around `strategy.run` records v² x for v = 3, the loss
is `strategy.reduce` SUM, and the gradient is applied once in
cross-replica context with SGD(0.125). The job's gradient is
2 v (1 + 2) = 18 on both workers, and both must hold the same bytes after
the step: v = 3 - 0.125 * 18 = 0.75.

    python -m tfdtape.cli.multi_worker_check CONFIGURATION   (a worker; TF_CONFIG set)
"""

import contextlib
import json
import os
import socket
import subprocess
import sys
import time

WORKERS = 2
TIME_LIMIT = 180
EXPECTED = "total over both workers, applied alike"


def observe(strategy):
    """The observation of the two-worker spanning step in the configuration
    active now (`strategy`, verify's own, is not used: the workers make
    theirs)."""
    del strategy
    outputs = _run_workers(_active_configuration())
    if isinstance(outputs, str):
        return outputs
    gradients = {output.get("gradient") for output in outputs}
    if any("error" in output for output in outputs):
        errors = {output["error"] for output in outputs}
        return ("raised " if len(errors) == 1 else "raised differently: ") + \
            " / ".join(sorted(errors))
    if gradients != {18.0}:
        return f"gradients {sorted(map(str, gradients))}"
    if len({output["bytes"] for output in outputs}) != 1:
        return "workers drifted apart"
    if outputs[0]["value"] != 0.75:
        return f"applied: v = {outputs[0]['value']:g}"
    return EXPECTED


def _active_configuration():
    from tfdtape import patching
    from tfdtape import testing
    return {(False, True): "stock", (True, True): "tfdtape",
            (True, False): "tfdtape_alone", (False, False): "pre_seed"}[
        (patching.is_installed(), testing.native_resolver_is_registered())]


def _run_workers(configuration):
    """Each worker's JSON output, or a string saying what went wrong."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(WORKERS)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        ports = [sock.getsockname()[1] for sock in sockets]
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    processes = []
    deadline = time.monotonic() + TIME_LIMIT
    try:
        for index in range(WORKERS):
            environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TFDTAPE_AUTOINSTALL="0",
                               TF_CONFIG=json.dumps({"cluster": cluster, "task": {
                                   "type": "worker", "index": index}}))
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "tfdtape.cli.multi_worker_check", configuration],
                env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True))
        outputs = []
        for process in processes:
            try:
                out, err = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return f"timed out after {TIME_LIMIT} s: both workers killed"
            if process.returncode != 0:
                last = (err.strip().splitlines() or ["no output"])[-1]
                return f"a worker failed: {last[:60]}"
            outputs.append(json.loads(out.strip().splitlines()[-1]))
        return outputs
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def _worker(configuration):
    """One worker: the step in `configuration`; prints its JSON."""
    import numpy as np
    import tensorflow as tf

    from tfdtape import testing
    tf.get_logger().setLevel("ERROR")
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with testing.configuration(configuration), strategy.scope():
        v = tf.Variable(3.0)
        optimizer = tf.keras.optimizers.SGD(0.125)
        optimizer.build([v])
        x = tf.constant(float(task + 1))
        try:
            with tf.GradientTape() as tape:
                loss = strategy.reduce("SUM", strategy.run(lambda: v * v * x), axis=None)
            gradient = tape.gradient(loss, v)
            options = ({"skip_gradients_aggregation": True}
                       if isinstance(optimizer.iterations, tf.Variable) else {})
            optimizer.apply_gradients([(gradient, v)], **options)
        except Exception as error:
            text = (str(error).strip().splitlines() or [""])[0]
            print(json.dumps({"error": f"{type(error).__name__}: {text[:60]}"}))
            return
        value = np.float32(v.numpy())
        print(json.dumps({"gradient": float(gradient), "value": float(value),
                          "bytes": value.tobytes().hex()}))


if __name__ == "__main__":
    _worker(sys.argv[1])
