"""Jobs started by the engines users' clusters run, each of 2 processes:
Slurm's srun (a one-node Slurm a fixture starts), Open MPI's mpirun and
MPICH's mpiexec (from their wheels), and TF_CONFIG as Kubeflow's TFJob
writes it with a chief. Each trains tests/engine_process.py's linear model
as a Horovod program, through MultiWorkerMirroredStrategy() and through
Keras 3's DataParallel, and must end with one device's weights on the
global batches on every process; a launch that cannot be one job is
refused on every process; without tfdtape (the control) srun's processes
are jobs of one. The engines are tests/engines.py's; these tests run in
the 2.21 stage only (not per release: the reading is tfdtape's own)."""

import json
import os
import subprocess

import pytest

import engines
import loopback

pytestmark = pytest.mark.cluster

SCRIPT = str(loopback.TESTS / "engine_process.py")
TIME_LIMIT = 300


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    cluster = engines.Slurm(tmp_path_factory.mktemp("slurm")).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def reference():
    return loopback.run_processes([None], [SCRIPT, "reference"], 120)[0]["weights"]


def environment(base=None, **more):
    env = dict(base or os.environ, TF_CPP_MIN_LOG_LEVEL="3", **more)
    env.pop("TF_CONFIG", None)
    return env


def run(command, env, expect_success=True):
    """The JSON line each process printed (in no order) and stderr."""
    completed = subprocess.run(command, env=env, capture_output=True, text=True,
                               timeout=TIME_LIMIT, stdin=subprocess.DEVNULL)
    if expect_success:
        assert completed.returncode == 0, completed.stderr[-3000:]
    found = [json.loads(line) for line in completed.stdout.splitlines()
             if line.startswith("{")]
    return found, completed


def assert_one_job_like_one_device(found, mode, reference):
    assert len(found) == 2
    for result in found:
        assert result["weights"] == pytest.approx(reference, rel=1e-6, abs=1e-7)
    if mode == "horovod":
        assert sorted((r["rank"], r["size"], r["local_rank"], r["local_size"])
                      for r in found) == [(0, 2, 0, 2), (1, 2, 1, 2)]
    elif mode == "strategy":
        assert sorted(tuple(r["task"]) for r in found) == [("worker", 0), ("worker", 1)]
    if mode != "horovod":
        assert [r["replicas"] for r in found] == [2, 2]


MODES = ["horovod", "strategy", "distribution"]


@pytest.mark.parametrize("mode", MODES)
def test_srun_starts_one_job(slurm, reference, mode):
    found, _ = run(["srun", "-n", "2", engines.python(), SCRIPT, mode],
                   environment(slurm.environment()))
    assert_one_job_like_one_device(found, mode, reference)


def test_without_tfdtape_srun_starts_two_jobs_of_one(slurm):
    found, _ = run(["srun", "-n", "2", engines.python(), SCRIPT, "strategy"],
                   environment(slurm.environment(), TFDTAPE_AUTOINSTALL="0"))
    assert [r["replicas"] for r in found] == [1, 1]


def test_a_step_that_cannot_be_one_job_is_refused_on_every_process(slurm):
    _, completed = run(["srun", "-n", "2", "--distribution=plane=1", engines.python(),
                        SCRIPT, "horovod"], environment(slurm.environment()),
                       expect_success=False)
    assert completed.returncode != 0
    assert completed.stderr.count(
        "JobFormationError: tfdtape: Slurm (srun) started several processes and they "
        "cannot be made one job (Slurm (srun)): expected tasks distributed block or "
        "cyclic over the nodes, found SLURM_DISTRIBUTION=plane in TensorFlow ") == 2


def test_a_sweep_says_so_and_each_process_is_a_job_of_its_own(slurm):
    found, _ = run(["srun", "-n", "2", engines.python(), SCRIPT, "horovod"],
                   environment(slurm.environment(), TFDTAPE_INDEPENDENT_PROCESSES="1"))
    assert [(r["rank"], r["size"]) for r in found] == [(0, 1), (0, 1)]


@pytest.mark.parametrize("mode", MODES)
def test_open_mpi_mpirun_starts_one_job(reference, mode):
    mpirun = engines.mpi_launcher("openmpi")
    found, _ = run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2",
                    engines.python(), SCRIPT, mode], environment())
    assert_one_job_like_one_device(found, mode, reference)


@pytest.mark.parametrize("mode", ["horovod", "strategy"])
def test_mpich_mpiexec_starts_one_job(reference, mode):
    mpiexec = engines.mpi_launcher("mpich")
    found, _ = run([mpiexec, "-n", "2", engines.python(), SCRIPT, mode], environment())
    assert_one_job_like_one_device(found, mode, reference)


def test_a_tfjob_with_a_chief_is_one_horovod_job(reference):
    ports = loopback.free_ports(3)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"],
               "evaluator": [f"127.0.0.1:{ports[2]}"]}
    found = loopback.run_processes(
        [{"cluster": cluster, "task": {"type": kind, "index": 0}}
         for kind in ("chief", "worker")], [SCRIPT, "horovod"], TIME_LIMIT)
    assert [(r["rank"], r["size"]) for r in found] == [(0, 2), (1, 2)]
    for result in found:
        assert result["weights"] == pytest.approx(reference, rel=1e-6, abs=1e-7)
