"""Generated faults (tests/generated_faults.py) against the uninterrupted
job, on 2 processes under `tfdtape launch --max-restarts`: every faulted
job ends as the uninterrupted one did, bitwise on every rank, with the
same files and nothing half-written left, within the launch's time limit.

CI runs `--fault-seed 51 --fault-cases 4` (one case of each job); a longer
search by hand is `pytest tests/test_generated_faults.py --fault-seed S
--fault-cases N` (docs/testing.md).
"""

import os
import re

import pytest
import tensorflow as tf

import fault_points
import generated_faults
import restart_jobs
from keras_models import is_keras3

CI_SEED = 51
CI_CASES = 4


def listing(directory):
    """Every file and folder under `directory`, relative, sorted."""
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*"))


def leftovers(directory):
    """tfdtape's staging files left in the launch's TMPDIR."""
    return sorted(path.name for path in restart_jobs.temporary_of(directory).iterdir()
                  if path.name.startswith("tfdtape-"))


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
    whole_directory, whole = restart_jobs.uninterrupted(case.job, tmp_path_factory,
                                                        *case.arguments,
                                                        processes=case.processes)
    directory = tmp_path / "job"
    directory.mkdir()
    job = restart_jobs.launch(case.job, directory, *case.arguments, processes=case.processes,
                              restarts=case.restarts(),
                              env={fault_points.ENVIRONMENT: case.environment()})
    where = case.describe()
    assert job.status == 0, f"{where}: the launch ended with {job.status}:\n{job.stderr[-3000:]}"
    assert job.stderr.count("restarting every process") == case.restarts(), (
        f"{where}: a fault was not reached\n{job.stderr[-3000:]}")
    assert sorted(job.ranks) == list(range(case.processes)), where
    inside = re.findall(rf"{fault_points.INSIDE_WORDS} (\S+):(\w+)", job.stderr)
    assert len(inside) == sum(fault.moment == "collective" for fault in case.faults), where
    assert all(f"{os.sep}tensorflow{os.sep}" in path for path, _ in inside), (where, inside)
    for rank, result in job.ranks.items():
        assert result["variables"] == whole.ranks[0]["variables"], f"{where}: rank {rank}"
        assert result["epochs"] == case.resumed_epochs(), f"{where}: rank {rank}'s epochs"
    assert listing(directory) == listing(whole_directory), where
    assert leftovers(directory) == [], where


def test_the_grammar_reaches_every_job_moment_victim_and_way():
    drawn = generated_faults.draw(CI_SEED, 120)
    faults = [fault for case in drawn for fault in case.faults]
    assert {case.job for case in drawn} == set(generated_faults.JOBS)
    assert {(case.job, fault.moment) for case in drawn for fault in case.faults} == {
        (job, moment) for job, moments in generated_faults.MOMENTS_OF.items()
        for moment in moments}
    assert {fault.victims for fault in faults} == set(generated_faults.VICTIMS)
    assert {len(fault.victims) for fault in faults if fault.moment == "collective"} == {1}
    assert {case.arguments for case in drawn if case.job == "horovod"} == {(), ("--sync-bn",)}
    elastic = {case.arguments for case in drawn if case.job == "elastic"}
    assert {form for form, *_ in elastic} == {"fit", "loop"}
    assert {option for _, *options in elastic for option in options} == {
        "--process-set", "--sync-bn"}
    assert all(case.processes == (4 if "--process-set" in case.arguments else 2)
               for case in drawn)
    assert {fault.way for fault in faults} == set(fault_points.WAYS)
    assert {len(case.faults) for case in drawn} == {1, 2}
    assert all(fault.moment != "restore" for case in drawn for fault in case.faults[:1])
    for case in drawn:  # every fault is reached: its epoch is one its attempt trains
        if len(case.faults) == 2 and case.faults[1].epoch != fault_points.ANY_EPOCH:
            assert case.faults[1].epoch >= case.faults[0].epoch, case.describe()
    assert generated_faults.draw(CI_SEED, 1)[0].resumed_epochs() == [1, 2, 3]
    assert [case.job for case in generated_faults.draw(CI_SEED, CI_CASES)] == [
        "fit", "loop", "horovod", "elastic"]
