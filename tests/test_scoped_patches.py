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
from assertions import assert_same_objects
from tfdtape import events
from tfdtape import targets
from tfdtape.cli import scale_traps
from tfdtape.cli import stock_observers

pytestmark = pytest.mark.per_release

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


class Collecting:
    """A sink that keeps the watch decisions and gradient calls it is sent."""
    complete = True
    records_untaped = False

    def __init__(self):
        self.watches, self.gradients = [], []

    def add_event(self, event):
        self.watches.append(event)

    def add_gradient(self, event):
        self.gradients.append(event)


def test_the_stock_observers_report_what_stock_tensorflow_watches(uninstalled, strategy):
    with strategy.scope():
        mirrored = tf.Variable(2.0)
    plain = tf.Variable(3.0)
    sink = Collecting()

    def replica_step():
        with tf.GradientTape() as tape:
            loss = mirrored * mirrored
        return tape.gradient(loss, mirrored)

    events.open_sink(sink)
    try:
        with stock_observers.observe_stock():
            grads = strategy.run(replica_step)
            with strategy.scope(), tf.GradientTape() as tape:
                # What tape.watch hands the tape (stock's watch itself
                # raises first, on the container's handle).
                tape_module.watch_variable(tape._tape, mirrored)
                cross_replica_watched = tape.watched_variables()
            with tf.GradientTape() as tape:
                tape_module.variables_accessed([plain])  # as a tf.function's call once did
                plain_gradient = tape.gradient(plain * plain, plain)
    finally:
        events.close_sink(sink)
    components = strategy.experimental_local_results(mirrored)
    assert [float(g) for g in strategy.experimental_local_results(grads)] == [4.0] * 4
    assert float(plain_gradient) == 6.0
    assert_same_objects(cross_replica_watched, components)
    by_context = {}
    for event in sink.watches:
        by_context.setdefault((event.kind, event.context), []).append(event)
    replica_reads = by_context.pop(("access", "replica"))
    assert sorted(event.replica_id for event in replica_reads) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(event.resolved[0] is mirrored and len(event.resolved) == 1
               for event in replica_reads)  # stock watches the container there
    [watch] = by_context.pop(("watch", "cross-replica"))
    assert_same_objects(watch.resolved, components)  # and every component here
    plain_reads = by_context.pop(("access", "no strategy"))
    assert len(plain_reads) == 2  # variables_accessed, then plain * plain (one read)
    assert all(event.resolved[0] is plain for event in plain_reads)
    assert by_context == {}
    assert [len(event.asked) for event in sink.gradients] == [1] * 5
    assert {event.context for event in sink.gradients} == {"replica", "no strategy"}


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
