"""Generated Horovod programs (tests/generated_horovod.py) on 2, 3 and 4
launched processes against a NumPy oracle: every collective and grouped
collective, reduction, dtype, scalars and empty tensors, scale factors,
compression, process sets, eager and traced, uneven rows, splits and roots,
and training steps (DistributedGradientTape, DistributedOptimizer with
sparse_as_dense, backward_passes_per_step, IndexedSlices);
the cases run in order in one launch per seed. CI runs one seed per job
size; `--horovod-seed S --horovod-cases N` (below) runs a longer search by
hand (docs/testing.md has its counts)."""

import dataclasses
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import generated_horovod as gh
import loopback

pytestmark = pytest.mark.cluster

HERE = pathlib.Path(__file__).resolve().parent
CI_SEED, CI_CASES = 51, 60


def run_job(size, seed, count):
    """Every rank's records of one launch of `count` cases."""
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
                       PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get(
                           "PYTHONPATH", "")]))
    environment.pop("TF_CONFIG", None)
    completed = subprocess.run(
        [sys.executable, "-m", "tfdtape", "launch", "-np", str(size), "--grace", "3",
         sys.executable, str(HERE / "generated_horovod_process.py"), str(seed), str(count)],
        capture_output=True, text=True, env=environment, timeout=900)
    assert completed.returncode == 0, completed.stderr[-4000:]
    records = loopback.launched_outputs(completed.stdout, starts="[")
    assert sorted(records) == list(range(size))
    return records


def search(request):
    return (request.config.getoption("--horovod-seed") or CI_SEED,
            request.config.getoption("--horovod-cases") or CI_CASES)


@pytest.mark.parametrize("size", [2, 3, 4])
def test_generated_horovod_programs_match_numpy_on_every_process(request, size):
    seed, count = search(request)
    cases = gh.draw(seed, count, size)
    counts, failing = gh.judged(seed, cases, size, run_job(size, seed, count))
    print(f"\n{size} processes, seed {seed}: {counts['value']} right, "
          f"{counts['refused']} refused alike, {len(failing)} failing")
    assert failing == []
    assert counts["value"] >= 0.8 * count  # a guard on the draw: mostly values


def test_the_oracle_knows_horovods_semantics():
    """The oracle alone, on cases written out: Average of integers
    truncates, reducescatter cuts the first ranks one row more, alltoall
    with splits, a process outside the set."""
    case = gh.Case(index=0, kind="reducescatter", op="Average", dtype="int32",
                   rows=(5, 5), tail=(), tensors=1, prescale=1.0, postscale=1.0,
                   compression="none", traced=False, members=(), root=0, splits=())
    inputs = [gh.inputs(7, case, rank)[0] for rank in range(2)]
    total = (inputs[0].astype(int) + inputs[1]) / 2
    assert gh.expected(7, case, 2, 0)[1][0].tolist() == list(total.astype(int)[:3])
    assert gh.expected(7, case, 2, 1)[1][0].tolist() == list(total.astype(int)[3:])
    swap = dataclass_replace(case, kind="alltoall", op="Sum", rows=(3, 1),
                             splits=((1, 2), (1, 0)))
    sent = [gh.inputs(7, swap, rank)[0] for rank in range(2)]
    assert gh.expected(7, swap, 2, 1)[1][0].tolist() == sent[0][1:3].tolist()
    outside = dataclass_replace(case, members=(0, 2))
    assert gh.expected(7, outside, 3, 1) == ("absent", None)
    scalar = dataclass_replace(case, kind="allgather", rows=(None, None))
    assert gh.expected(7, scalar, 2, 0) == ("refused", "scalar")


def test_the_oracle_trains_as_horovod_does():
    """Training kinds, written out: the tape's Average of x^T c and of the
    embedding's rows; an optimizer with backward_passes_per_step 2 called 3
    times applies once, the all-reduce of each process's mean of its first
    two passes; a predivided IndexedSlices gradient is refused."""
    tape = gh.Case(index=3, kind="tape", op="Average", dtype="float64", rows=(2, 0),
                   tail=(), tensors=1, prescale=1.0, postscale=1.0, compression="none",
                   traced=False, members=(), root=0, splits=(), sparse_as_dense=False)
    x, c, ids, d = gh.batch(7, tape, 0, 0)
    table = np.zeros((5, 2))
    np.add.at(table, ids, d)
    weight_gradient, table_gradient = gh.expected(7, tape, 2, 1)[1]
    assert weight_gradient.tolist() == (x.T @ c / 2).tolist()
    assert table_gradient.tolist() == (table / 2).tolist()
    optimizer = dataclass_replace(tape, kind="optimizer", op="Sum", rows=(1, 2), passes=2,
                                  average_passes=True, steps=3)
    start = gh.initial_variables(7, optimizer)
    means = [sum(gh.local_gradients(7, optimizer, rank, step)[0] for step in (0, 1)) / 2
             for rank in (0, 1)]
    assert gh.expected(7, optimizer, 2, 0)[1][0].tolist() == (
        start[0] - gh.LEARNING_RATE * (means[0] + means[1])).tolist()
    predivided = dataclass_replace(tape, predivide=2.0)
    assert gh.expected(7, predivided, 2, 0) == ("refused", "predivided")
    assert gh.expected(7, dataclass_replace(predivided, sparse_as_dense=True), 2, 0)[0] == (
        "value")


def dataclass_replace(case, **changes):
    return dataclasses.replace(case, **changes)
