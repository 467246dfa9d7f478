"""Keras `fit`, `evaluate` and `predict` on MultiWorkerMirroredStrategy with
2 and 3 workers on loopback train like one device on the global batch
(tfdtape.keras3_multi_worker, with tfdtape.keras3_accumulation for
`gradient_accumulation_steps`): every copy of every weight, the
accumulators, the iteration counter, History's losses, evaluate's loss and
predict's output as one process with no strategy computes; every worker
bitwise equal to the others.

Stock TensorFlow is the control: Keras 3's `fit` fails in its symbolic
build ("Attempt to convert a value (PerReplica ...)", tensorflow#72388).
tf_keras (`TF_USE_LEGACY_KERAS=1`) trains on stock and with tfdtape alike.
"""

import pathlib

import numpy as np
import pytest
import tensorflow as tf

import loopback
from keras_models import is_keras3

# Worker processes on loopback: they run alone, not beside other tests.
pytestmark = [pytest.mark.per_release, pytest.mark.cluster]

SCRIPT = str(pathlib.Path(__file__).parent / "keras_worker_process.py")
TIMEOUT_SECONDS = 240
STOCK_BUILD_ERROR = "Attempt to convert a value (PerReplica"
KERAS3_CASES = [
    (2, "sgd", 0, "tfdtape"),
    (2, "adam", 2, "tfdtape"),
    (2, "sgd", 2, "tfdtape_alone"),
    (2, "adam", 0, "tfdtape_alone"),
    (2, "sgd", 2, "tfdtape"),
]
"""(workers, optimizer, accumulation steps, configuration): the cases of
one worker count train one after the other in one cluster. Two workers
only: Keras 3's fit on 3 processes is tests/test_keras_distribution.py's
(DataParallel trains through the same trainer), which saves a cluster per
stage."""
_found = {}


def results(workers, cases, legacy=False):
    """Each case's results, one per process: `workers` workers of one
    cluster, or (0) one process with no strategy, training `cases`
    ((optimizer, accumulation steps, configuration)) one after the other."""
    env = {"TF_USE_LEGACY_KERAS": "1"} if legacy else {"TF_USE_LEGACY_KERAS": "0"}
    configs = loopback.worker_configs(workers) if workers else [None]
    per_process = loopback.run_processes(
        configs, [SCRIPT, *(":".join(map(str, case)) for case in cases)],
        TIMEOUT_SECONDS, env=env)
    return [list(per_case) for per_case in zip(*per_process)]


def cached(key, workers, cases, legacy=False):
    """`results(workers, cases, legacy)` as a dict by case, run once per `key`."""
    if key not in _found:
        _found[key] = dict(zip(cases, results(workers, cases, legacy)))
    return _found[key]


def keras3_results(workers, optimizer_name, accumulate, configuration):
    """A case of KERAS3_CASES, from the one cluster of its worker count."""
    cases = [case[1:] for case in KERAS3_CASES if case[0] == workers]
    return cached(("keras3", workers), workers, cases)[
        (optimizer_name, accumulate, configuration)]


def one_device(optimizer_name, accumulate, legacy=False):
    """The one-process reference: all of KERAS3_CASES' in one process, or
    tf_keras's (`legacy`)."""
    cases = ([("adam", 0, "stock")] if legacy else
             sorted({(case[1], case[2], "stock") for case in KERAS3_CASES}))
    (reference,) = cached(("one device", legacy), 0, cases, legacy)[
        (optimizer_name, accumulate, "stock")]
    assert "error" not in reference, reference.get("traceback")
    return reference


def assert_like_one_device(found, reference):
    assert [r["task"] for r in found] == list(range(len(found)))
    for result in found:
        assert "error" not in result, result.get("traceback")
        for kind in ("weights", "accumulators"):
            assert len(result[kind]) == len(reference[kind])
            for index, (components, (expected,)) in enumerate(
                    zip(result[kind], reference[kind])):
                assert len(components) == 1  # one replica per worker
                np.testing.assert_allclose(components[0], expected, rtol=1e-5, atol=1e-6,
                                           err_msg=f"{kind} {index}")
        assert result["iterations"] == reference["iterations"]
        np.testing.assert_allclose(result["losses"], reference["losses"], rtol=1e-5)
        np.testing.assert_allclose(result["evaluated"], reference["evaluated"], rtol=1e-5)
        np.testing.assert_allclose(result["predicted"], reference["predicted"],
                                   rtol=1e-5, atol=1e-6)
        for key in ("weights", "accumulators", "iterations", "losses", "evaluated",
                    "predicted"):
            assert result[key] == found[0][key], f"workers differ in {key}"


keras3_only = pytest.mark.skipif(not is_keras3(tf.keras), reason="Keras 3's trainer (tf.keras "
                                 "before TensorFlow 2.16 is Keras 2)")


@keras3_only
@pytest.mark.parametrize("workers,optimizer_name,accumulate,configuration", KERAS3_CASES)
def test_keras3_fit_evaluate_predict_on_workers_match_one_device(
        workers, optimizer_name, accumulate, configuration):
    reference = one_device(optimizer_name, accumulate)
    if accumulate:  # an odd number of steps: the accumulators hold a step
        assert any(np.any(np.asarray(a)) for a in reference["accumulators"])
    assert_like_one_device(
        keras3_results(workers, optimizer_name, accumulate, configuration), reference)


@keras3_only
@pytest.mark.per_release(False)
@pytest.mark.parametrize("accumulate", [0, 2])
def test_stock_keras3_fit_fails_on_workers(accumulate):
    """The control: what tfdtape mends fails on TensorFlow as it ships."""
    found = cached(("stock keras3", 2), 2, [("sgd", 0, "stock"), ("sgd", 2, "stock")])[
        ("sgd", accumulate, "stock")]
    for result in found:
        assert result["error"].startswith("ValueError: " + STOCK_BUILD_ERROR), result


@pytest.mark.parametrize("configuration", [
    pytest.param("stock", marks=pytest.mark.per_release(False)), "tfdtape"])
def test_tf_keras_fit_on_workers_matches_one_device_as_on_stock(configuration):
    """tf_keras needs nothing mended; tfdtape changes nothing there."""
    pytest.importorskip("tf_keras")
    found = cached(("tf_keras", 2), 2, [("adam", 0, "stock"), ("adam", 0, "tfdtape")],
                   legacy=True)[("adam", 0, configuration)]
    assert_like_one_device(found, one_device("adam", 0, legacy=True))
