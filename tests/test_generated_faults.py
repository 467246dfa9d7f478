"""Generated faults (tests/generated_faults.py) against the uninterrupted
job, on 2 processes under `tfdtape launch --max-restarts`: every faulted
job ends as the uninterrupted one did, bitwise on every rank, with the
same files and nothing half-written left, within the launch's time limit.

CI runs `--fault-seed 51 --fault-cases 3` (one case of each job); a longer
search by hand is `pytest tests/test_generated_faults.py --fault-seed S
--fault-cases N` (docs/testing.md).
"""

import os
import pathlib
import subprocess
import sys

import pytest
import tensorflow as tf

import exercise_recorder
import fault_points
import generated_faults
import loopback
from keras_models import is_keras3

HERE = pathlib.Path(__file__).resolve().parent
SCRIPTS = {"fit": HERE / "keras_saving_process.py",
           "loop": HERE / "checkpoint_loop_process.py",
           "horovod": HERE / "horovod_scripts" / "checkpoint_resume.py"}
CI_SEED = 51
CI_CASES = 3
TIME_LIMIT_SECONDS = 300


def launch(job, directory, restarts=0, faults=""):
    """`tfdtape launch -np 2` of `job`'s script writing in `directory`, its
    TMPDIR beside it: (status, stderr, each rank's JSON)."""
    temporary = directory.parent / f"{directory.name}-tmp"
    temporary.mkdir()
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TMPDIR=str(temporary),
                       PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
                       **{fault_points.ENVIRONMENT: faults})
    environment.pop("TF_CONFIG", None)
    recorder = ([str(HERE / "recorded_process.py")]
                if exercise_recorder.ENVIRONMENT in environment else [])
    completed = subprocess.run(
        [sys.executable, "-m", "tfdtape", "launch", "-np", "2", "--grace", "3",
         "--max-restarts", str(restarts), sys.executable, *recorder, str(SCRIPTS[job]),
         str(directory)],
        env=environment, capture_output=True, text=True, timeout=TIME_LIMIT_SECONDS)
    return completed.returncode, completed.stderr, loopback.launched_outputs(completed.stdout)


def listing(directory):
    """Every file and folder under `directory`, relative, sorted."""
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*"))


def leftovers(directory):
    """tfdtape's staging files left in the launch's TMPDIR."""
    temporary = directory.parent / f"{directory.name}-tmp"
    return sorted(path.name for path in temporary.iterdir() if path.name.startswith("tfdtape-"))


_uninterrupted = {}


def uninterrupted(job, tmp_path_factory):
    """The job run whole: (its listing, rank 0's JSON); once a session."""
    if job not in _uninterrupted:
        directory = tmp_path_factory.mktemp(f"whole-{job}") / "job"
        directory.mkdir()
        status, stderr, ranks = launch(job, directory)
        assert status == 0, stderr[-3000:]
        assert ranks[0]["variables"] == ranks[1]["variables"]
        _uninterrupted[job] = (listing(directory), ranks[0])
    return _uninterrupted[job]


def cases(config):
    seed = config.getoption("--fault-seed")
    count = config.getoption("--fault-cases")
    return generated_faults.draw(CI_SEED if seed is None else seed,
                                 CI_CASES if count is None else count)


def pytest_generate_tests(metafunc):
    if "case" in metafunc.fixturenames:
        found = cases(metafunc.config)
        metafunc.parametrize("case", found, ids=[f"{c.index}-{c.job}" for c in found])


@pytest.mark.cluster
@pytest.mark.skipif(not is_keras3(tf.keras), reason="the fit job is Keras 3's")
def test_a_faulted_job_ends_as_the_uninterrupted_job(case, tmp_path, tmp_path_factory):
    files, whole = uninterrupted(case.job, tmp_path_factory)
    directory = tmp_path / "job"
    directory.mkdir()
    status, stderr, ranks = launch(case.job, directory, restarts=case.restarts(),
                                   faults=case.environment())
    where = case.describe()
    assert status == 0, f"{where}: the launch ended with {status}:\n{stderr[-3000:]}"
    assert sorted(ranks) == [0, 1], where
    for rank, result in ranks.items():
        assert result["variables"] == whole["variables"], f"{where}: rank {rank}"
        if case.ends_after_training():
            assert result["epochs"] == [], f"{where}: rank {rank} trained again"
    assert listing(directory) == files, where
    assert leftovers(directory) == [], where


def test_the_grammar_reaches_every_job_moment_victim_and_way():
    drawn = generated_faults.draw(CI_SEED, 60)
    faults = [fault for case in drawn for fault in case.faults]
    assert {case.job for case in drawn} == set(generated_faults.JOBS)
    assert {(case.job, fault.moment) for case in drawn for fault in case.faults} == {
        (job, moment) for job, moments in generated_faults.MOMENTS_OF.items()
        for moment in moments}
    assert {fault.victims for fault in faults} == set(generated_faults.VICTIMS)
    assert {fault.way for fault in faults} == set(fault_points.WAYS)
    assert {len(case.faults) for case in drawn} == {1, 2}
    assert all(fault.moment != "restore" for case in drawn for fault in case.faults[:1])
    assert [case.job for case in generated_faults.draw(CI_SEED, CI_CASES)] == [
        "fit", "loop", "horovod"]
