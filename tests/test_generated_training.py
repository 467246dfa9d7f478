"""Generated Keras training programs against an oracle that knows nothing
of tfdtape (`generated_training`: NumPy's math of one device on the global
batch): `fit`, the tutorial step and the tape around `strategy.run` (eager
and traced) × SGD and Adam × Keras 3's gradient accumulation × the clip
options × Keras 3's LossScaleOptimizer (with a step that overflows on one
replica) × fit's steps_per_execution × a custom loop inside or outside
strategy.scope() × no strategy, MirroredStrategy over 1, 2 and 4 virtual
CPUs, and MultiWorkerMirroredStrategy over 2 and 3 workers on loopback.

Each program trains on stock TensorFlow, with tfdtape and with tfdtape
alone, and is classified as `generated_programs.classify` does: the test
fails on any outcome but "right", "clear_error" and "stock_fails_alike",
listing the failing programs (and, shrunk, the fewest choices that still
fail) as specs that `generated_training_process.py --program SPEC` replays.
On several workers every worker's results with tfdtape must also be equal,
bitwise (stock's workers may disagree: that is the control). The
counts per outcome and per dimension are printed (`pytest -s`).
"""

import pathlib

import numpy as np
import pytest

import generated_programs as gp
import generated_training as gt
import loopback

pytestmark = pytest.mark.per_release

HERE = pathlib.Path(__file__).resolve().parent
CI_SEED = 22
CI_CASES = 24
"""Programs per device layout in CI: about 25 s of a subprocess each."""
RELEASE_SEARCH = (23, 8)
"""(seed, programs per layout) in the version stages (--per-release): 8
programs of another seed than CI's whose draw holds a program clipping
inside the replicas on 2 and 4 CPUs (the guard below; CI's seed needs 16)."""
CLUSTER_CASES = 10
LAYOUTS = (1, 2, 4)
TIME_LIMIT = 1200


def stock_wrong(record):
    return gp.stock_wrong(record, gt.same)


def summary(records, where):
    return gp.outcome_summary(records, f"training programs on {where}", gt.DIMENSIONS,
                              gt.same)


@pytest.mark.parametrize("devices", LAYOUTS, ids=lambda d: f"{d}_cpus")
def test_generated_training_trains_like_one_device_or_fails_clearly(request, devices):
    seed, cases = gp.search_size(request.config, (CI_SEED, CI_CASES), RELEASE_SEARCH)
    records = gp.run_generator("generated_training_process.py", devices, seed, cases,
                               TIME_LIMIT)
    assert len(records) == cases
    print("\n" + summary(records, f"{devices} virtual CPU(s)"))
    failing = gp.failures(records)
    assert not failing, failing
    # The search tells stock from tfdtape (stock fails the tape around
    # strategy.run, and accumulation in fit and traced steps).
    assert any(map(stock_wrong, records))
    # A guard on the sample, not on tfdtape (the outcomes above are that):
    # with Keras 3 on several replicas, the draw holds programs whose clip
    # inside the replicas changes the answer, so tfdtape was checked against
    # the oracle's sum of clipped shares, not only against one device.
    if devices > 1 and records[0]["keras3"]:
        assert any(r["expected"] != gt.oracle(gt.TrainingProgram(**r["program"]), 1, True)
                   for r in records)


@pytest.mark.cluster
@pytest.mark.per_release(False)
@pytest.mark.parametrize("workers", [2])  # 3: test_multi_worker_spanning, keras_distribution
def test_generated_training_on_workers_trains_like_one_device(request, workers):
    seed, _ = gp.search_size(request.config, (CI_SEED, CI_CASES), RELEASE_SEARCH)
    outputs = loopback.run_processes(
        loopback.worker_configs(workers),
        [str(HERE / "generated_training_process.py"), "--seed", str(seed + workers),
         "--cases", str(CLUSTER_CASES)], TIME_LIMIT)
    records = outputs[0]
    assert len(records) == CLUSTER_CASES
    print("\n" + summary(records, f"{workers} workers"))

    def patched(found):  # stock's workers may disagree (the control)
        return [{name: r["found"][name] for name in ("tfdtape", "alone")} for r in found]

    for other in outputs[1:]:  # every worker's results with tfdtape, bitwise
        assert patched(other) == patched(records)
    failing = gp.failures(records)
    assert not failing, failing
    assert any(map(stock_wrong, records))


def program(**choices):
    return gt.TrainingProgram(**dict(gt.SIMPLEST, **choices))


def test_the_oracle_is_one_device_whatever_the_replicas_without_a_clip_inside():
    one = gt.oracle(program(strategy="none"), 1, True)
    for replicas in (2, 4):
        assert gt.oracle(program(), replicas, True) == one
        assert gt.oracle(program(loop="tutorial", clipping="clipnorm", accumulation=2),
                         replicas, True) == gt.oracle(program(
                             strategy="none", clipping="clipnorm", accumulation=2), 1, True)
    assert one["iterations"] == gt.STEPS and one["copies_agree"] is True


def test_the_oracle_works_one_sgd_step_out_by_hand():
    """After one SGD step from (KERNEL, BIAS): minus the rate times the
    gradient of the first batch's mean squared error."""
    x = gt.FEATURES[:gt.GLOBAL_BATCH].astype(np.float64)
    y = gt.LABELS[:gt.GLOBAL_BATCH].astype(np.float64)
    start_kernel, start_bias = gt.KERNEL.astype(np.float64), gt.BIAS.astype(np.float64)
    error = x @ start_kernel + start_bias - y
    kernel = start_kernel - 0.1 * 2 * x.T @ error / len(x)
    bias = start_bias - 0.1 * 2 * error.mean()
    steps, gt.STEPS = gt.STEPS, 1
    try:
        found = gt.oracle(program(strategy="none"), 1, True)
    finally:
        gt.STEPS = steps
    np.testing.assert_allclose(found["kernel"], kernel.ravel(), rtol=1e-12)
    assert found["bias"] == pytest.approx(bias[0], rel=1e-12)


def test_clipping_inside_the_replicas_is_not_one_device():
    inside = program(loop="tutorial", clipping="global_clipnorm")
    assert gt.clips_inside_replicas(inside, 2, keras3=True)
    assert not gt.clips_inside_replicas(inside, 2, keras3=False)  # tf_keras all-reduces first
    assert not gt.clips_inside_replicas(inside, 1, keras3=True)
    assert gt.oracle(inside, 2, True)["kernel"] != gt.oracle(inside, 1, True)["kernel"]
    for clipping in ("clipnorm", "clipvalue"):
        clipped = program(loop="fit", clipping=clipping)
        assert gt.oracle(clipped, 4, True) != gt.oracle(clipped, 1, True)


def test_accumulation_updates_every_second_step():
    accumulated = gt.oracle(program(strategy="none", accumulation=2), 1, True)
    assert accumulated["iterations"] == gt.STEPS // 2
    assert accumulated != gt.oracle(program(strategy="none"), 1, True)


def test_a_failure_shrinks_towards_the_simplest_program_keeping_the_strategy():
    failing = program(loop="fit", optimizer="adam", accumulation=2, clipping="clipvalue",
                      strategy="multi_worker")
    shrunk = gt.shrink(failing, lambda p: p.accumulation == 2)
    assert shrunk == program(accumulation=2, strategy="multi_worker")
