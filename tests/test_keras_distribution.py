"""Keras 3's distribution API on TensorFlow (tfdtape.keras3_distribution):
`set_distribution(DataParallel(...))` and `distribution.scope()` train on
every device like one device on the global batch (SGD, Adam, gradient
accumulation, a custom `train_step`; `fit`, `evaluate`, `predict`) on 2 and
4 virtual CPUs, and across 2 and 3 processes after
`keras.distribution.initialize()`; what TensorFlow cannot train is refused.

Stock Keras is the control: it accepts the distribution and trains on one
device with plain variables, silently.
"""

import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import keras_distribution_process as process_script
import loopback
from keras_models import is_keras3
from run_helpers import SCRIPTS
from run_helpers import script_line
from run_helpers import summary_of
from run_helpers import tfdtape_run
from tfdtape import events
from tfdtape import keras3_distribution
from tfdtape import testing
from tfdtape.cli import event_counts
from tfdtape.cli import one_device_distribution
from tfdtape.testing import PATCHED_CONFIGURATIONS

pytestmark = pytest.mark.per_release

SCRIPT = str(pathlib.Path(__file__).parent / "keras_distribution_process.py")
TIME_LIMIT = 300
keras3_only = pytest.mark.skipif(not is_keras3(tf.keras), reason="keras.distribution is "
                                 "Keras 3's (tf.keras before TensorFlow 2.16 is Keras 2)")
_layouts = {}


def layout(devices):
    """What tests/keras_distribution_process.py prints for `devices` CPUs
    (one process per layout, run once)."""
    if devices not in _layouts:
        completed = subprocess.run(
            [sys.executable, SCRIPT, "--devices", str(devices)], capture_output=True,
            text=True, timeout=TIME_LIMIT, cwd=pathlib.Path(SCRIPT).parent)
        assert completed.returncode == 0, completed.stderr[-3000:]
        _layouts[devices] = json.loads(completed.stdout.splitlines()[-1])
    return _layouts[devices]


def cpus(devices):
    return [f"/job:localhost/replica:0/task:0/device:CPU:{index}" for index in range(devices)]


def assert_like_one_device(found, reference, devices, loss_scale=1.0):
    """`found` trained as `reference` did on one device, with a copy of
    every weight on each of `devices`; its logged losses are `loss_scale`
    times the reference's."""
    assert "error" not in found, found.get("traceback")
    for weight, (expected,) in zip(found["weights"], reference["weights"], strict=True):
        assert [device for _, device in weight] == devices  # a copy on every device
        for value, _ in weight:
            np.testing.assert_allclose(value, expected[0], rtol=1e-5, atol=1e-6)
        assert all(value == weight[0][0] for value, _ in weight)  # copies agree
    assert found["iterations"] == reference["iterations"]
    np.testing.assert_allclose(found["losses"], np.multiply(reference["losses"], loss_scale),
                               rtol=1e-5)
    np.testing.assert_allclose(found["evaluated"], reference["evaluated"], rtol=1e-5)
    np.testing.assert_allclose(found["predicted"], reference["predicted"], rtol=1e-5,
                               atol=1e-6)


SCENARIOS = ["set_sgd/tfdtape", "set_sgd/tfdtape_alone", "scope_adam/tfdtape",
             "set_accumulating_sgd/tfdtape", "set_accumulating_sgd/tfdtape_alone",
             "custom_train_step/tfdtape", "custom_loop/tfdtape", "custom_loop/tfdtape_alone"]


LAYOUTS = [2, pytest.param(4, marks=pytest.mark.per_release(False))]
"""Virtual CPUs of the layouts (one process each): the version stages run 2."""


@keras3_only
@pytest.mark.parametrize("devices", LAYOUTS, ids=lambda d: f"{d}_cpus")
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_data_parallel_trains_on_every_device_like_one_device(devices, scenario):
    found = layout(devices)
    name = scenario.partition("/")[0]
    assert found["devices"] == [f"cpu:{index}" for index in range(devices)]
    # A custom step logs what Keras's compute_loss gives in a replica: its
    # share scaled by 1/replicas for the sum across them (as on stock
    # TensorFlow under a MirroredStrategy of the program's own).
    assert_like_one_device(found["scenarios"][scenario], found["reference"][name],
                           cpus(devices), 1 / devices if name == "custom_train_step" else 1.0)


@keras3_only
@pytest.mark.parametrize("devices", LAYOUTS, ids=lambda d: f"{d}_cpus")
def test_a_custom_train_step_runs_in_a_replica_on_every_device(devices):
    found = layout(devices)["scenarios"]["custom_train_step/tfdtape"]
    assert found["replica_devices"] == cpus(devices)
    assert layout(devices)["reference"]["custom_train_step"]["replica_devices"] == [""]


@keras3_only
def test_stock_keras_takes_the_distribution_and_trains_on_one_device():
    """The control: without tfdtape the distribution is silently ignored."""
    found = layout(2)
    stock = found["scenarios"]["set_sgd/stock"]
    assert "error" not in stock, stock.get("traceback")
    assert [len(weight) for weight in stock["weights"]] == [1] * 4  # plain variables
    assert stock["weights"] == found["reference"]["set_sgd"]["weights"]


@keras3_only
def test_a_model_built_before_the_distribution_is_refused_and_none_puts_back_no_strategy():
    found = layout(2)
    assert found["built_before"]["error"].startswith(
        "ValueError: tfdtape: a Keras model built before the Keras distribution was set "
        "(model 'sequential")
    assert "on its 2 devices, found sequential" in found["built_before"]["error"]
    assert "Build and compile the model after keras.distribution.set_distribution" in (
        found["built_before"]["error"])
    assert found["strategy_after"] == "_DefaultDistributionStrategy"


@pytest.fixture
def keras_distribution():
    """keras.distribution, with no distribution set after the test."""
    import keras
    yield keras.distribution
    keras.distribution.set_distribution(None)


def data_parallel_of(distribution, mesh):
    """DataParallel(device_mesh=mesh); where Keras fails to make one of a
    mesh of several axes (Keras 3.15 warns with an int for the category:
    TypeError), the DataParallel it would have made."""
    try:
        return distribution.DataParallel(device_mesh=mesh)
    except TypeError as error:
        assert "category must be a Warning subclass" in str(error)
        made = distribution.DataParallel.__new__(distribution.DataParallel)
        distribution.DataParallel.__mro__[1].__init__(made, mesh, mesh.axis_names[0])
        return made


def refusal_cases(distribution):
    devices = distribution.list_devices()
    mesh = distribution.DeviceMesh((2, 2), ["batch", "model"], devices)
    layout_map = distribution.LayoutMap(mesh)
    layout_map[".*kernel"] = (None, "model")
    return {
        "model_parallel": (
            lambda: distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch"),
            "a Keras distribution TensorFlow cannot train (keras.distribution.ModelParallel): "
            "expected keras.distribution.DataParallel, found ModelParallel"),
        "two_axis_mesh": (
            lambda: data_parallel_of(distribution, mesh),
            "expected a device mesh of one (data) axis, found a mesh of shape (2, 2) "
            "(axes ['batch', 'model'])"),
        "missing_device": (
            lambda: distribution.DataParallel(devices=["cpu:0", "gpu:7"]),
            "a Keras distribution over devices this process does not have "
            "(keras.distribution.DataParallel): expected devices among"),
        "no_device_name": (
            lambda: distribution.DataParallel(devices=["banana"]),
            "a Keras distribution over devices this process does not have "
            "(keras.distribution.DataParallel): expected devices among"),
        "device_twice": (
            lambda: distribution.DataParallel(devices=["cpu:0", "cpu:0"]),
            "a Keras distribution naming a device twice (keras.distribution.DataParallel): "
            "expected devices among"),
        "not_a_distribution": (
            lambda: "cpu:0",
            "a Keras distribution TensorFlow cannot train (keras.distribution.str): "
            "expected keras.distribution.DataParallel, found str (not a "
            "keras.distribution.Distribution)"),
    }


@keras3_only
@pytest.mark.filterwarnings("ignore:Expect the input mesh to be 1D")
@pytest.mark.parametrize("case", ["model_parallel", "two_axis_mesh", "missing_device",
                                  "no_device_name", "device_twice", "not_a_distribution"])
def test_what_tensorflow_cannot_train_is_refused_where_it_is_set(
        keras_distribution, configuration, case):
    make, message = refusal_cases(keras_distribution)[case]
    value = make()
    if configuration not in PATCHED_CONFIGURATIONS:  # Keras takes it, and ignores it
        keras_distribution.set_distribution(value)
        assert keras_distribution.distribution() is value
        assert not tf.distribute.has_strategy()
        return
    with pytest.raises(ValueError) as raised:
        keras_distribution.set_distribution(value)
    assert str(raised.value).startswith("tfdtape: ")
    assert message in str(raised.value)
    assert f"in TensorFlow {tf.__version__}." in str(raised.value)
    assert keras_distribution.distribution() is None
    assert not tf.distribute.has_strategy()
    if isinstance(value, str):
        return  # no scope() to try
    with pytest.raises(ValueError):  # through scope() too
        with value.scope():
            pass


@keras3_only
def test_a_job_of_several_processes_without_initialize_is_refused(
        keras_distribution, monkeypatch, configuration):
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"worker": ["localhost:1", "localhost:2"]},
        "task": {"type": "worker", "index": 0}}))
    value = keras_distribution.DataParallel(devices=["cpu:0"])
    if configuration not in PATCHED_CONFIGURATIONS:
        keras_distribution.set_distribution(value)  # one device, silently
        return
    with pytest.raises(ValueError, match=r"before keras.distribution.initialize\(\) "
                       r"\(keras.distribution.set_distribution\): expected "
                       r"keras.distribution.initialize\(\) first"):
        keras_distribution.set_distribution(value)


@keras3_only
def test_initialize_refuses_addresses_that_are_no_job(keras_distribution, configuration):
    if configuration not in PATCHED_CONFIGURATIONS:
        with pytest.raises(AttributeError, match="initialize"):  # Keras's stub backend
            keras_distribution.initialize("localhost:1", 2, 0)
        return
    with pytest.raises(ValueError, match="one host:port per process"):
        keras_distribution.initialize("localhost:1", 2, 0)
    with pytest.raises(ValueError, match="0 <= process_id < num_processes"):
        keras_distribution.initialize("localhost:1,localhost:2", 2, 2)


@keras3_only
def test_inside_a_strategy_scope_setting_is_refused(keras_distribution, configuration,
                                                    strategy):
    value = keras_distribution.DataParallel(devices=["cpu:0"])
    with strategy.scope():
        if configuration not in PATCHED_CONFIGURATIONS:
            keras_distribution.set_distribution(value)
            return
        with pytest.raises(RuntimeError, match="inside MirroredStrategy.scope()"):
            keras_distribution.set_distribution(value)
    assert keras_distribution.distribution() is None


@keras3_only
def test_a_run_without_tfdtape_reports_a_distribution_trained_on_one_device(keras_distribution):
    """What `tfdtape run --no-install` holds: TensorFlow's functions
    observed, the first model trained on one device under a set Keras
    distribution reported once."""
    import keras
    with testing.configuration("stock"):
        recorder = event_counts.EventCounts()
        events.open_sink(recorder)
        try:
            with one_device_distribution.observe_one_device_distributions():
                keras_distribution.set_distribution(
                    keras_distribution.DataParallel(devices=["cpu:0", "cpu:1"]))
                names = []
                for _ in range(2):
                    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
                    model.compile("sgd", "mse")
                    model.fit(np.ones((4, 3)), np.ones((4, 1)), verbose=0)
                    names.append(model.name)
        finally:
            events.close_sink(recorder)
    warnings = recorder.snapshot()["warnings"]
    assert [(w["kind"], w["subject"]) for w in warnings] == [(
        one_device_distribution.ONE_DEVICE_DISTRIBUTION,
        f"DataParallel over 2 devices set, model {names[0]!r} trained on one device")]


@keras3_only
@pytest.mark.per_release(False)
def test_the_run_report_names_the_distribution_keras_ignores(tmp_path):
    """End to end: `tfdtape run --no-install` warns; `tfdtape run` trains
    on both devices and has nothing to warn of."""
    script = shutil.copy(SCRIPTS / "keras_distribution.py", tmp_path)
    stock = tfdtape_run("--no-install", "--json", str(tmp_path / "stock.json"),
                        "keras_distribution.py", cwd=tmp_path)
    assert stock.returncode == 0, stock.stderr
    assert stock.stdout.strip() == "trained with 1 copies"
    [warning] = json.loads((tmp_path / "stock.json").read_text())["warnings"]
    assert (warning["kind"], warning["subject"], warning["location"]) == (
        one_device_distribution.ONE_DEVICE_DISTRIBUTION,
        "DataParallel over 2 devices set, model 'guide_model' trained on one device",
        f"{script}:{script_line('keras_distribution.py', '# FIT')}")
    summary = " ".join(summary_of(stock.stderr).split())
    assert "Keras accepts the distribution and ignores it" in summary
    installed = tfdtape_run("--json", str(tmp_path / "installed.json"),
                            "keras_distribution.py", cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr
    assert installed.stdout.strip() == "trained with 2 copies"
    assert json.loads((tmp_path / "installed.json").read_text())["warnings"] == []


@pytest.mark.skipif(is_keras3(tf.keras), reason="Keras 2 has no keras.distribution")
def test_keras_2_has_no_distribution_api_and_nothing_is_patched():
    from tfdtape import targets
    assert keras3_distribution.defining_module() is None
    assert not [target for target in targets.patch_targets()
                if "distribution" in target.symbol]


def job(processes, explicit, accumulate):
    """Every process's result of a job of `processes` on loopback, and the
    one-device reference (Adam, accumulating `accumulate` steps or none)."""
    env = {"TF_USE_LEGACY_KERAS": "0"}
    options = ["--accumulate", str(accumulate)]
    found = loopback.run_processes(
        loopback.worker_configs(processes),
        [SCRIPT, "--job", *options, *(["--explicit"] if explicit else [])], TIME_LIMIT,
        env=env)
    (reference,) = loopback.run_processes(
        [None], [SCRIPT, "--job", "--reference", *options], TIME_LIMIT,
        env=dict(env, JOB_PROCESSES=str(processes)))
    return found, reference


@keras3_only
@pytest.mark.cluster
@pytest.mark.parametrize("processes,explicit,accumulate", [
    (2, False, 0), pytest.param(3, True, 2, marks=pytest.mark.per_release(False))])
def test_data_parallel_across_processes_trains_like_one_device(processes, explicit, accumulate):
    """initialize() from TF_CONFIG (2 processes) or from its arguments (3):
    each process gets its share of every global batch; every process ends
    with one device's weights on the global batches, bitwise equal, after
    as many optimizer steps (Keras knows each shard's batches: with a shard
    of unknown length it ran one step more per epoch)."""
    found, reference = job(processes, explicit, accumulate)
    assert "error" not in reference, reference.get("traceback")
    share = process_script.GLOBAL_BATCH // processes
    features = process_script.FEATURES
    for index, result in enumerate(found):
        assert "error" not in result, result.get("traceback")
        assert (result["processes"], result["process_id"]) == (processes, index)
        if result["first_share"] is None:  # keras-nightly 3.16 has no distribute_dataset
            assert not result["keras"].startswith("3.15")
        else:
            np.testing.assert_allclose(result["first_share"],
                                       features[index * share:(index + 1) * share], rtol=0)
        assert_like_one_device(result, reference,
                               [f"/job:worker/replica:0/task:{index}/device:CPU:0"])
        for key in ("weights", "losses", "evaluated", "predicted", "iterations"):
            if key == "weights":
                assert [[value for value, _ in weight] for weight in result[key]] == [
                    [value for value, _ in weight] for weight in found[0][key]]
            else:
                assert result[key] == found[0][key], f"processes differ in {key}"
