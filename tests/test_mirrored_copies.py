"""Mirrored copies that drift apart (tfdtape.cli.mirrored_copies): the run
report names, at the end of the run, every mirrored variable the tapes saw
whose copies differ, with the largest difference and the two devices; a
healthy run gets nothing new. Sync-on-read variables differ by design and
are not compared. In-process with a recorder on MirroredStrategy(4), and
end to end through `python -m tfdtape run` with and without `--no-install`.
"""

import gc
import json
import shutil

import numpy as np
import pytest
import tensorflow as tf

from conftest import DEVICES
from keras_models import is_keras3
from run_helpers import SCRIPTS
from run_helpers import Recording
from run_helpers import summary_of
from run_helpers import tfdtape_run
from tfdtape.cli import event_counts
from tfdtape.cli import mirrored_copies

pytestmark = pytest.mark.per_release


def mirrored(strategy, value, **options):
    with strategy.scope():
        return tf.Variable(value, **options)


def test_equal_copies_give_none(strategy):
    variable = mirrored(strategy, [1.0, 2.0])
    assert mirrored_copies.is_mirrored(variable)
    assert mirrored_copies.differing_copies(variable) is None


def test_the_copy_that_differs_most_is_named_with_its_device(strategy):
    variable = mirrored(strategy, [1.0, 2.0])
    variable.values[1].assign([1.0, 2.5])
    variable.values[3].assign([0.0, 2.0])
    difference = mirrored_copies.differing_copies(variable)
    assert difference == mirrored_copies.Difference(
        1.0, 3, (variable.values[0].device, variable.values[3].device))
    assert difference.describe() == (
        f"copies 0 and 3 differ by up to 1 ({variable.values[0].device}, "
        f"{variable.values[3].device})")
    assert variable.values[3].device.endswith("device:CPU:3")


def test_a_nan_in_one_copy_only_is_an_infinite_difference(strategy):
    variable = mirrored(strategy, [np.nan, 2.0])
    assert mirrored_copies.differing_copies(variable) is None  # NaN alike everywhere
    variable.values[2].assign([1.0, 2.0])
    assert mirrored_copies.differing_copies(variable).largest == float("inf")


def test_integer_copies_are_compared(strategy):
    variable = mirrored(strategy, 7, dtype=tf.int64)
    variable.values[1].assign(9)
    assert mirrored_copies.differing_copies(variable).largest == 2.0


def test_sync_on_read_and_plain_variables_are_not_compared(strategy):
    on_read = mirrored(strategy, 0.0, synchronization=tf.VariableSynchronization.ON_READ,
                       aggregation=tf.VariableAggregation.SUM)
    assert not mirrored_copies.is_mirrored(on_read)
    assert not mirrored_copies.is_mirrored(tf.Variable(1.0))
    one_copy = mirrored(tf.distribute.MirroredStrategy(DEVICES[:1]), 1.0)
    assert not mirrored_copies.is_mirrored(one_copy)


def recorded_and_checked(strategy, drift):
    """A recorder that saw a tape read a mirrored variable (and one it did
    not read) inside strategy.run; `drift` moves one copy of each."""
    read, unread = mirrored(strategy, [1.0, 2.0]), mirrored(strategy, [3.0])
    with Recording() as recorder:
        def replica():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(read * read)
            return tape.gradient(loss, read)
        strategy.run(replica)
    if drift:
        read.values[2].assign([1.0, 2.125])
        unread.values[1].assign([0.0])
    recorder.check_copies()
    return read, recorder.snapshot()["warnings"]


def test_the_recorder_names_a_variable_it_saw_whose_copies_differ(strategy):
    read, warnings = recorded_and_checked(strategy, drift=True)
    (warning,) = warnings  # the unread variable is not the run's
    assert warning["kind"] == event_counts.COPIES_DIFFER
    assert warning["variable"] == read.name  # a plain tf.Variable: its name
    assert warning["subject"].startswith("copies 0 and 2 differ by up to 0.125 (")


def test_a_healthy_run_gets_no_warning(strategy):
    _, warnings = recorded_and_checked(strategy, drift=False)
    assert warnings == []


def test_a_variable_freed_before_the_check_is_passed_over(strategy):
    held = [mirrored(strategy, [1.0])]
    with Recording() as recorder:
        def replica():
            with tf.GradientTape() as tape:
                loss = held[0] * 2.0
            return tape.gradient(loss, held[0])
        strategy.run(replica)
    held[0].values[1].assign([5.0])
    recorder.check_copies()
    assert len(recorder.snapshot()["warnings"]) == 1  # seen while alive
    held.clear()
    gc.collect()
    recorder.check_copies()
    assert recorder.snapshot()["warnings"] == []


@pytest.mark.parametrize("options", [
    (), pytest.param(("--no-install",), marks=pytest.mark.per_release(False))])
def test_the_run_report_names_the_drifted_kernel_of_a_keras_model(tmp_path, options):
    shutil.copy(SCRIPTS / "drifted_copies.py", tmp_path)
    for healthy in (False, True):
        completed = tfdtape_run(*options, "--json", str(tmp_path / "r.json"),
                                "drifted_copies.py", *(["healthy"] if healthy else []),
                                cwd=tmp_path)
        assert completed.returncode == 0, completed.stderr
        assert completed.stdout == "trained\n"
        warnings = json.loads((tmp_path / "r.json").read_text())["warnings"]
        summary = " ".join(summary_of(completed.stderr).split())
        if healthy:
            assert warnings == [] and "Warnings" not in summary
            continue
        # Keras 3 installed: the tape sees Keras's variable (its path);
        # observed only (--no-install), TensorFlow's MirroredVariable (its
        # name). Keras 2's variable is the MirroredVariable (its name).
        if not is_keras3(tf.keras):
            name = "dense/kernel:0"
        else:
            name = "sequential/dense/kernel:0" if options else "sequential/dense/kernel"
        assert [(w["kind"], w["variable"]) for w in warnings] == [
            (event_counts.COPIES_DIFFER, name)]
        assert warnings[0]["subject"] == (
            "copies 0 and 1 differ by up to 0.25 "
            "(/job:localhost/replica:0/task:0/device:CPU:0, "
            "/job:localhost/replica:0/task:0/device:CPU:1)")
        assert f"{name}: copies 0 and 1 differ by up to 0.25" in summary
