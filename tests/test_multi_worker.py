"""MultiWorkerMirroredStrategy with two worker processes on localhost.

Each worker imports tfdtape and trains the linear model of linear_training;
the weights must equal a single-process MirroredStrategy(2) run, and every
worker's tape must watch the containers.
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import tensorflow as tf

import linear_training
import loopback
from conftest import DEVICES

TESTS = pathlib.Path(__file__).parent
WORKERS = 2
TIMEOUT_SECONDS = 240


def run_workers():
    """Starts the workers, waits for them, always cleans up; returns their JSON."""
    ports = loopback.free_ports(WORKERS)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    processes = []
    try:
        for index in range(WORKERS):
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
                       TF_CONFIG=json.dumps({"cluster": cluster,
                                             "task": {"type": "worker",
                                                      "index": index}}),
                       PYTHONPATH=os.pathsep.join(
                           [str(TESTS), os.environ.get("PYTHONPATH", "")]))
            processes.append(subprocess.Popen(
                [sys.executable, str(TESTS / "multi_worker_process.py")],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True))
        results = []
        for process in processes:
            out, err = process.communicate(timeout=TIMEOUT_SECONDS)
            assert process.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def test_two_workers_train_like_one_process_with_two_replicas():
    results = run_workers()
    single = tf.distribute.MirroredStrategy(DEVICES[:2])
    kernel, bias, watched_containers = linear_training.train(single)
    assert watched_containers
    assert sorted(r["task"] for r in results) == [0, 1]
    for result in results:
        assert result["replicas"] == 2
        assert result["tfdtape_installed"] is True
        assert result["watched_containers"] is True
        np.testing.assert_allclose(result["kernel"], kernel, rtol=1e-6)
        np.testing.assert_allclose(result["bias"], bias, rtol=1e-6)
    assert not np.allclose(kernel, [[0.5], [-0.5]])  # it trained
