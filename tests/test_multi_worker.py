"""MultiWorkerMirroredStrategy with two worker processes on localhost.

Each worker imports tfdtape and trains the linear model of linear_training;
the weights must equal a single-process MirroredStrategy(2) run (itself in a
third process: its collective groups would clash with this process's
4-replica strategies), and every worker's tape must watch the containers.
"""

import json
import pathlib

import numpy as np
import pytest

import loopback

# Worker processes on loopback: they run alone, not beside other tests
# (README's test command runs the `cluster` tests in a pytest run of their own).
pytestmark = [pytest.mark.per_release, pytest.mark.cluster]

TESTS = pathlib.Path(__file__).parent
WORKERS = 2
TIMEOUT_SECONDS = 240


def run_processes(tf_configs, runner=(), script="multi_worker_process.py"):
    """Runs `script` once per TF_CONFIG (None: no cluster) as `python
    RUNNER... SCRIPT`; returns their JSON results in order."""
    return loopback.run_processes(tf_configs, [*runner, str(TESTS / script)],
                                  TIMEOUT_SECONDS)


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


@pytest.mark.per_release(False)
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
