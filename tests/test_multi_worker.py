"""MultiWorkerMirroredStrategy with two worker processes on localhost.

Each worker imports tfdtape and trains the linear model of linear_training;
the weights must equal a single-process MirroredStrategy(2) run (itself in a
third process: its collective groups would clash with this process's
4-replica strategies), and every worker's tape must watch the containers.
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np

import loopback

TESTS = pathlib.Path(__file__).parent
WORKERS = 2
TIMEOUT_SECONDS = 240


def run_processes(tf_configs):
    """Runs multi_worker_process.py once per TF_CONFIG (None: no cluster), all
    at once; waits, always cleans up; returns their JSON results in order."""
    processes = []
    try:
        for tf_config in tf_configs:
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
                       PYTHONPATH=os.pathsep.join(
                           [str(TESTS), os.environ.get("PYTHONPATH", "")]))
            env.pop("TF_CONFIG", None)
            if tf_config is not None:
                env["TF_CONFIG"] = json.dumps(tf_config)
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
    ports = loopback.free_ports(WORKERS)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    *workers, single = run_processes(
        [{"cluster": cluster, "task": {"type": "worker", "index": index}}
         for index in range(WORKERS)] + [None])
    assert single["replicas"] == 2 and single["watched_containers"] is True
    kernel = np.array(single["kernel"])
    bias = np.array(single["bias"])
    assert [r["task"] for r in workers] == [0, 1]
    for result in workers:
        assert result["replicas"] == 2
        assert result["tfdtape_installed"] is True
        assert result["watched_containers"] is True
        np.testing.assert_allclose(result["kernel"], kernel, rtol=1e-6)
        np.testing.assert_allclose(result["bias"], bias, rtol=1e-6)
    assert not np.allclose(kernel, [[0.5], [-0.5]])  # it trained
