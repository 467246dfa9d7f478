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
import pytest
import tensorflow as tf

import loopback

# Worker processes on loopback: they run alone, not beside other tests
# (README's test command runs the `cluster` tests in a pytest run of their own).
pytestmark = pytest.mark.cluster

TESTS = pathlib.Path(__file__).parent
WORKERS = 2
TIMEOUT_SECONDS = 240


def run_processes(tf_configs, runner=(), script="multi_worker_process.py"):
    """Runs `script` (multi_worker_process.py) once per TF_CONFIG (None: no
    cluster), all at once, each as `python RUNNER... SCRIPT`; waits, always
    cleans up; returns their JSON results in order."""
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
                [sys.executable, *runner, str(TESTS / script)],
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


def test_each_worker_writes_its_own_run_report(tmp_path):
    """`python -m tfdtape run --json report-{task}.json` on every worker."""
    ports = loopback.free_ports(WORKERS)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    pattern = str(tmp_path / "report-{task}.json")
    workers = run_processes(
        [{"cluster": cluster, "task": {"type": "worker", "index": index}}
         for index in range(WORKERS)],
        runner=("-m", "tfdtape", "run", "--quiet", "--json", pattern))
    assert [r["task"] for r in workers] == [0, 1]
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "report-worker-0.json", "report-worker-1.json"]
    for index in range(WORKERS):
        report = json.loads((tmp_path / f"report-worker-{index}.json").read_text())
        assert report["task"] == f"worker-{index}"
        assert report["exit_status"] == 0 and report["none_gradients"] == []
        reads = [w for w in report["watched"] if w["kind"] == "access"]
        assert reads and {w["how"] for w in reads} == {"container"}
        assert {w["strategy"] for w in reads} == {"CollectiveAllReduceStrategy"}


def test_the_spanning_step_is_refused_on_several_workers():
    """A gradient outside strategy.run covers this worker's replicas only,
    and applying one there would let the workers drift apart: both are
    refused with MultiWorkerMirroredStrategy and strategy.run named, and
    every worker keeps the same weights."""
    ports = loopback.free_ports(WORKERS)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    workers = run_processes(
        [{"cluster": cluster, "task": {"type": "worker", "index": index}}
         for index in range(WORKERS)], script="multi_worker_spanning_process.py")
    assert [r["task"] for r in workers] == [0, 1]
    version = f"in TensorFlow {tf.__version__}."
    for result in workers:
        for key, what, symbol in (
                ("gradient_in_scope", "cannot take the total derivative for 'w:0'",
                 "tf.GradientTape.gradient"),
                ("gradient_no_scope", "cannot take the total derivative for 'w:0'",
                 "tf.GradientTape.gradient"),
                ("apply_in_scope", "cannot apply gradients",
                 "tf.__internal__.distribute.interim.maybe_merge_call")):
            kind, message = result[key]
            assert kind == "ValueError", (key, message)
            assert message.startswith(
                f"tfdtape: {what} outside strategy.run under several workers "
                f"({symbol}): expected a call inside strategy.run"), message
            assert ("CollectiveAllReduceStrategy in multi-worker mode "
                    "(MultiWorkerMirroredStrategy)") in message
            assert version in message
        assert result["v"] == [2.0]
