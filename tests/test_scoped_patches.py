"""Patches for the length of a block (`targets.scoped`): the stock observers
of `python -m tfdtape run --no-install` and its watch on
`tf.nn.compute_average_loss` go through the one table, so `info` names them,
`uninstall()` restores them and installing over them is refused clearly."""

import os
import subprocess
import sys

import pytest
import tensorflow as tf
from tensorflow.python.eager import backprop
from tensorflow.python.eager import tape as tape_module

import tfdtape
from tfdtape import events
from tfdtape import targets
from tfdtape.cli import scale_traps
from tfdtape.cli import stock_observers

OBSERVED = ((tape_module, "watch_variable"), (tape_module, "variable_accessed"),
            (tape_module, "variables_accessed"), (backprop.GradientTape, "gradient"))


def held(pairs):
    return {name: vars(owner)[name] for owner, name in pairs}


@pytest.fixture
def uninstalled():
    """tfdtape uninstalled for the test (as `run --no-install` has it)."""
    tfdtape.uninstall()
    yield
    tfdtape.install()


def test_the_stock_observers_hold_the_tape_functions_as_scoped(uninstalled):
    tensorflows = held(OBSERVED)
    with stock_observers.observe_stock():
        inside = held(OBSERVED)
        assert all(inside[name] is not tensorflows[name] for name in inside)
        assert {targets.original_of(f) for f in inside.values()} == set(
            tensorflows.values())
        assert {target.holder() for target in stock_observers.observer_targets()} == {
            targets.SCOPED}
        assert [target.symbol for target in targets.open_scoped_targets()] == [
            target.symbol for target in stock_observers.observer_targets()]
        assert tfdtape.is_installed() is False
        assert events.observing_stock is True
        with pytest.raises(tfdtape.PatchConflictError) as raised:
            tfdtape.install()
        assert "TensorFlow's functions are observed as stock" in str(raised.value)
        assert held(OBSERVED) == inside  # the refused install changed nothing
    assert held(OBSERVED) == tensorflows
    assert targets.open_scoped_targets() == []
    assert events.observing_stock is False


def test_uninstall_restores_what_a_scoped_block_holds(uninstalled):
    tensorflows = held(OBSERVED)
    sink_complete = []

    class Sink:
        complete = True
        records_untaped = False

        def add_event(self, event):
            del event

    sink = Sink()
    events.open_sink(sink)
    try:
        with stock_observers.observe_stock():
            assert tfdtape.uninstall() is False  # tfdtape was not installed
            assert held(OBSERVED) == tensorflows  # but TensorFlow's are back
            sink_complete.append(sink.complete)
        assert held(OBSERVED) == tensorflows  # the exit leaves them alone
    finally:
        events.close_sink(sink)
    assert sink_complete == [False]  # what the observers saw is incomplete


def test_compute_average_loss_is_one_scoped_replacement_everywhere():
    original = tf.nn.compute_average_loss
    table = scale_traps.average_loss_targets()
    assert {target.owner.__name__ for target in table} >= {
        "tensorflow.python.ops.nn_impl_distribute"
        if "tensorflow.python.ops.nn_impl_distribute" in sys.modules
        else "tensorflow.python.ops.nn_impl"}
    assert {target.holder() for target in table} == {targets.TENSORFLOW}
    with scale_traps.observe_average_losses():
        assert tf.nn.compute_average_loss is not original
        assert tf.compat.v2.nn.compute_average_loss is tf.nn.compute_average_loss
        assert targets.original_of(tf.nn.compute_average_loss) is original
        assert {target.holder() for target in table} == {targets.SCOPED}
        assert tfdtape.is_installed() is True
        assert tfdtape.uninstall() is True
        assert tf.nn.compute_average_loss is original  # restored with the rest
        assert tfdtape.is_installed() is False
        tfdtape.install()
        assert tf.nn.compute_average_loss is original  # install leaves it alone
    assert tf.nn.compute_average_loss is original
    assert targets.open_scoped_targets() == []


def test_a_scoped_block_restores_its_originals_on_exit():
    original = tf.nn.compute_average_loss
    with pytest.raises(RuntimeError, match="inside"):
        with scale_traps.observe_average_losses():
            assert tf.nn.compute_average_loss is not original
            raise RuntimeError("inside")
    assert tf.nn.compute_average_loss is original
    assert tf.compat.v2.nn.compute_average_loss is original


def test_info_lists_the_scoped_targets():
    completed = subprocess.run(
        [sys.executable, "-m", "tfdtape", "info"], capture_output=True, text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), timeout=300)
    assert completed.returncode == 0, completed.stderr
    section = completed.stdout.split("scoped patch targets", 1)[1].splitlines()[1:]
    assert ("  tensorflow.python.eager.tape.watch_variable: TensorFlow's original"
            in section)
    assert ("  tensorflow.python.eager.backprop.GradientTape.gradient: "
            "TensorFlow's original") in section
    assert any(line.startswith("  tensorflow.python.ops.nn_impl") and
               line.endswith(".compute_average_loss: TensorFlow's original")
               for line in section)
