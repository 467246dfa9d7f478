"""tfdtape.trace(): every watch decision, from every replica thread."""

import importlib

import pytest
import tensorflow as tf
from tensorflow.python.eager import tape as tape_module

import tfdtape
from tfdtape import events
from tfdtape import testing

pytestmark = pytest.mark.per_release


def test_trace_records_replica_reads_and_cross_replica_watch(strategy):
    with strategy.scope():
        v = tf.Variable([1.0, 2.0], name="weights")

    def step():
        with tf.GradientTape() as tape:
            tf.reduce_sum(v) * 2.0
        return tape.watched_variables()

    with tfdtape.trace() as trace:
        strategy.run(step)
        with strategy.scope():
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                tape.watch(v)
    reads = [e for e in trace.events if e.kind == "access"]
    assert sorted(e.replica_id for e in reads) == [0, 1, 2, 3]
    for event in reads:
        assert event.variable is v.values[event.replica_id]
        assert len(event.resolved) == 1 and event.resolved[0] is v
        assert (event.context, event.strategy) == ("replica", "MirroredStrategy")
    watches = [e for e in trace.events if e.kind == "watch"]
    assert len(watches) == 1
    assert watches[0].variable is v
    assert [r is c for r, c in zip(watches[0].resolved, v.values)] == [True] * 4
    assert (watches[0].context, watches[0].replica_id) == ("cross-replica", None)

    report = trace.report().splitlines()
    assert report[0].split() == ["kind", "variable", "shape", "context",
                                 "replica", "watched", "devices"]
    assert len(report) == 1 + len(trace.events)
    last = report[-1]
    assert last.split()[:4] == ["watch", "weights:0", "(2,)", "cross-replica"]
    assert "cross-replica" in last and "CPU:0, CPU:1, CPU:2, CPU:3" in last


def test_trace_is_off_outside_the_block():
    v = tf.Variable(1.0)
    with tfdtape.trace() as trace:
        assert events.active
        with tf.GradientTape() as tape:
            tape.watch(v)
    assert not events.active
    with tf.GradientTape() as tape:
        tape.watch(v)
    assert len(trace.events) == 1
    assert (trace.events[0].context, trace.events[0].strategy) == (
        "no strategy", "_DefaultDistributionStrategy")
    assert trace.events[0].replica_id is None


def test_a_trace_needs_tfdtape_installed():
    with testing.stock():
        with pytest.raises(RuntimeError) as raised:
            with tfdtape.trace():
                pass
    text = str(raised.value)
    assert text.startswith("tfdtape: cannot open a trace: tfdtape is not "
                           "installed (tfdtape.trace)")
    assert f"in TensorFlow {tf.__version__}. Call tfdtape.install() first" in text
    assert not events.active


def test_a_failed_watch_is_not_traced(strategy):
    with tfdtape.trace() as trace:
        with tf.GradientTape() as tape:
            with pytest.raises(tfdtape.NotWatchableError):
                tape.watch([tf.constant(1.0), None])
            with pytest.raises(tfdtape.NotWatchableError):
                tape_module.watch_variable(tape._tape, "weights")
    assert trace.events == []


def test_a_trace_open_while_tfdtape_is_uninstalled_says_it_is_incomplete():
    v = tf.Variable(1.0)
    with tfdtape.trace() as trace:
        with tf.GradientTape() as tape:
            tape.watch(v)
        assert trace.complete
        with testing.stock():  # uninstalls tfdtape inside the block
            with tf.GradientTape() as tape:
                tape.watch(v)
    assert len(trace.events) == 1
    assert trace.complete is False
    assert trace.report().splitlines()[0] == (
        "note: tfdtape was uninstalled while this was recording; what the "
        "tapes did after that is missing")


def test_a_reload_keeps_an_open_trace():
    v = tf.Variable(1.0)
    with tfdtape.trace() as trace:
        importlib.reload(events)
        with tf.GradientTape() as tape:
            tape.watch(v)
    assert len(trace.events) == 1 and not events.active
