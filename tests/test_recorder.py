"""The recorder behind `python -m tfdtape run`: counts, no references, and a
memory that does not grow with steps."""

import gc
import os
import tracemalloc
import weakref

import tensorflow as tf

import tfdtape
from tfdtape import explaining
from tfdtape import recorder as recorder_lib
from tfdtape import run_report
from tfdtape import tracing

RECORDING_FILES = tuple(
    os.path.join(os.path.dirname(tfdtape.__file__), name)
    for name in ("recorder.py", "tracing.py", "unrecorded_runs.py"))
"""Where what the recording keeps is allocated (TensorFlow's own allocations
on tfdtape's lines, such as the C++ tape's, are not the recorder's)."""


class Recording:
    """A Recorder attached to tracing for a with-block."""

    def __enter__(self):
        self.recorder = recorder_lib.Recorder()
        tracing.open_sink(self.recorder)
        return self.recorder

    def __exit__(self, *exc_info):
        tracing.close_sink(self.recorder)


def test_counts_by_variable_context_and_replica(strategy):
    with strategy.scope():
        v = tf.Variable(3.0, name="counted")
    unused = tf.Variable(1.0, name="unused")

    def step():
        with tf.GradientTape() as tape:
            loss = v * v
        return tape.gradient(loss, [v, unused])

    with Recording() as recorder:
        for _ in range(2):
            strategy.run(step)
        v.read_value()  # read with no tape recording: not counted
    snapshot = recorder.snapshot()
    assert snapshot["watched"] == [
        {"variable": "counted:0", "how": recorder_lib.CONTAINER, "kind": "access",
         "context": "replica", "replica": replica, "strategy": "MirroredStrategy",
         "count": 4} for replica in range(4)]
    (none,) = snapshot["none_gradients"]
    assert (none["source"], none["reason"], none["context"], none["count"]) == (
        "unused:0", explaining.NOT_READ, "replica", 8)
    assert none["location"].endswith(f"test_recorder.py:{step.__code__.co_firstlineno + 3}")
    assert snapshot["total_derivatives"] == []


def test_keeps_no_reference_to_variables(strategy):
    with Recording() as recorder:
        with strategy.scope():
            v = tf.Variable(3.0)
            with tf.GradientTape() as tape:
                tape.watch(v)
                loss = tf.add_n(list(v.values))
            tape.gradient(loss, v)
        reference = weakref.ref(v)
        del v, tape, loss
        gc.collect()
        assert reference() is None
    assert recorder.snapshot()["total_derivatives"][0]["components"] == 4


def test_memory_does_not_grow_with_steps():
    """2,000 steps, each with a read, an explicit watch and a None gradient:
    what the recording holds after 500 steps and after 2,000 is the same."""
    v = tf.Variable(2.0, name="v")
    unused = tf.Variable(1.0, name="unused")

    def step():
        with tf.GradientTape() as tape:
            tape.watch(v)
            loss = v * v
        tape.gradient(loss, [v, unused])

    def held_by_tfdtape(snapshot):
        return sum(stat.size for stat in snapshot.statistics("filename")
                   if stat.traceback[0].filename in RECORDING_FILES)

    with Recording() as recorder:
        tracemalloc.start()
        try:
            for _ in range(500):
                step()
            gc.collect()
            after_500 = held_by_tfdtape(tracemalloc.take_snapshot())
            for _ in range(1500):
                step()
            gc.collect()
            after_2000 = held_by_tfdtape(tracemalloc.take_snapshot())
        finally:
            tracemalloc.stop()
    snapshot = recorder.snapshot()
    assert [w["count"] for w in snapshot["watched"]] == [2000, 2000]  # read, watch
    assert [n["count"] for n in snapshot["none_gradients"]] == [2000]
    print(f"the recording holds {after_500} bytes after 500 steps, "
          f"{after_2000} after 2000")
    assert after_2000 - after_500 <= 256, (after_500, after_2000)


def test_an_empty_recording_is_the_reports_empty_snapshot():
    assert recorder_lib.Recorder().snapshot() == run_report.EMPTY_SNAPSHOT
