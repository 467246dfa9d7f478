"""The recorder behind `python -m tfdtape run`: counts, no references, and a
memory that does not grow with steps."""

import gc
import os
import tracemalloc
import weakref

import tensorflow as tf

import tfdtape
from conftest import DEVICES
from run_helpers import Recording
from tfdtape import explaining
from tfdtape.cli import event_counts
from tfdtape.cli import run_report

RECORDING_FILES = tuple(
    os.path.join(os.path.dirname(tfdtape.__file__), name)
    for name in ("cli/event_counts.py", "events.py", "spanning_tapes.py"))
"""Where what the recording keeps is allocated (TensorFlow's own allocations
on tfdtape's lines, such as the C++ tape's, are not the recorder's)."""


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
    assert snapshot["variables"] == [
        {"id": 1, "name": "counted:0", "type": "MirroredVariable",
         "strategy": "MirroredStrategy"},
        {"id": 2, "name": "unused:0", "type": "ResourceVariable",
         "strategy": None}]
    assert snapshot["watched"] == [
        {"variable": "counted:0", "id": 1, "how": event_counts.CONTAINER,
         "kind": "access", "context": "replica", "replica": replica,
         "strategy": "MirroredStrategy", "count": 4} for replica in range(4)]
    assert snapshot["gradient_calls"] == 8
    (none,) = snapshot["none_gradients"]
    assert (none["source"], none["id"], none["reason"], none["context"],
            none["count"]) == ("unused:0", 2, explaining.NOT_READ, "replica", 8)
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
    assert recorder.snapshot()["total_derivatives"][0]["workers"] == 1


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
    assert len(snapshot["variables"]) == 2
    print(f"the recording holds {after_500} bytes after 500 steps, "
          f"{after_2000} after 2000")
    assert after_2000 - after_500 <= 256, (after_500, after_2000)


def test_an_empty_recording_is_the_reports_empty_snapshot():
    assert event_counts.EventCounts().snapshot() == run_report.EMPTY_SNAPSHOT


def test_variables_that_share_a_name_get_rows_of_their_own(strategy):
    """Two variables called 'kernel' and a MirroredVariable beside its own
    first component ('shared:0' both): one row each, unique names, the same
    name in every section."""
    first, second = tf.Variable(1.0, name="kernel"), tf.Variable(2.0, name="kernel")
    with strategy.scope():
        mirrored = tf.Variable(3.0, name="shared")
    component = mirrored.values[0]
    with Recording() as recorder:
        with tf.GradientTape(persistent=True) as tape:
            # read_value: a plain variable passed straight into an op is read
            # by TensorFlow's C++ fast path, which tells no Python function.
            loss = first.read_value() * second.read_value()
        tape.gradient(loss, [first, second, mirrored, component])
        with strategy.scope():
            with tf.GradientTape() as tape:
                tape.watch(mirrored)
            tape.gradient(tf.constant(1.0), mirrored)
    snapshot = recorder.snapshot()
    assert [(v["id"], v["name"]) for v in snapshot["variables"]] == [
        (1, "kernel:0 #1"), (2, "kernel:0 #2"),
        (3, "shared:0 (MirroredVariable)"), (4, "shared:0 (ResourceVariable)")]
    assert [(w["variable"], w["how"], w["context"]) for w in snapshot["watched"]] == [
        ("kernel:0 #1", event_counts.PLAIN, "no strategy"),
        ("kernel:0 #2", event_counts.PLAIN, "no strategy"),
        ("shared:0 (MirroredVariable)", event_counts.COMPONENTS, "cross-replica")]
    assert [(n["source"], n["id"]) for n in snapshot["none_gradients"]] == [
        ("shared:0 (MirroredVariable)", 3), ("shared:0 (MirroredVariable)", 3),
        ("shared:0 (ResourceVariable)", 4)]


def test_a_keras_variable_is_one_row_named_by_its_path(strategy):
    keras = tf.keras
    if not hasattr(keras, "Variable") or issubclass(keras.Variable, tf.Variable):
        import pytest
        pytest.skip("Keras 3 variables need TensorFlow 2.16+")

    class TwoLayers(keras.Model):  # built at first call, as users write it
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(3)
            self.out = keras.layers.Dense(1)

        def call(self, inputs):
            return self.out(self.hidden(inputs))

    with strategy.scope():
        model = TwoLayers()
        model(tf.ones((1, 2)))

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(tf.ones((1, 2))))
        return tape.gradient(loss, model.trainable_variables)

    with Recording() as recorder:
        strategy.run(step)
    snapshot = recorder.snapshot()
    paths = [variable.path for variable in model.trainable_variables]
    assert len(set(paths)) == 4
    assert sorted(v["name"] for v in snapshot["variables"]) == sorted(paths)
    assert {w["variable"] for w in snapshot["watched"]} == set(paths)
    assert {(w["variable"], w["replica"]) for w in snapshot["watched"]} == {
        (path, replica) for path in paths for replica in range(4)}
    assert {w["how"] for w in snapshot["watched"]} == {event_counts.CONTAINER}


def test_distributed_variables_made_inside_a_tf_function_are_components(strategy):
    made = []

    @tf.function
    def step():
        with strategy.scope():
            if not made:
                made.append(tf.Variable(2.0, name="inner"))
            with tf.GradientTape() as tape:
                loss = made[0] * made[0]
            return tape.gradient(loss, made[0])

    with Recording() as recorder:
        step()
    snapshot = recorder.snapshot()
    assert [(v["name"], v["type"]) for v in snapshot["variables"]] == [
        ("inner:0", "MirroredVariable")]
    assert {(w["how"], w["context"]) for w in snapshot["watched"]} == {
        (event_counts.COMPONENT, "cross-replica")}
    assert [(t["source"], t["components"]) for t in snapshot["total_derivatives"]] == [
        ("inner:0", 4)]


def test_warnings_for_what_the_recorder_can_see(strategy):
    outside = tf.Variable(1.0, name="outside")  # not in strategy.scope()
    with strategy.scope():
        inside = tf.Variable(2.0, name="inside")

    def replica_step():
        with tf.GradientTape() as tape:
            loss = outside * inside
        return tape.gradient(loss, [outside, inside])

    with Recording() as recorder:
        strategy.run(replica_step)
        with strategy.scope():
            with tf.GradientTape() as tape:
                loss = inside * 3.0  # reads one component: one device
            tape.gradient(loss, inside)
            try:
                tf.GradientTape().watch("not a tensor")
            except tfdtape.NotWatchableError:
                pass
    warnings = recorder.snapshot()["warnings"]
    this_file = os.path.abspath(__file__)
    read_line = replica_step.__code__.co_firstlineno + 2
    assert [(w["kind"], w["variable"], w["count"]) for w in warnings] == [
        (event_counts.REPLICA_PLAIN, "outside:0", 8),  # 4 reads, 4 sources
        (event_counts.ONE_DEVICE, None, 1),
        (event_counts.REFUSAL, None, 1)]
    assert warnings[0]["location"] == f"{this_file}:{read_line}"
    assert warnings[1]["location"].startswith(f"{this_file}:")
    assert warnings[2]["message"].startswith("tfdtape: cannot watch")
    assert warnings[2]["location"].startswith(f"{this_file}:")


def test_no_warning_for_a_plain_variable_without_several_replicas():
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    outside = tf.Variable(1.0, name="outside")

    def replica_step():
        with tf.GradientTape() as tape:
            loss = outside * outside
        return tape.gradient(loss, outside)

    with Recording() as recorder:
        one.run(replica_step)
    snapshot = recorder.snapshot()
    assert snapshot["warnings"] == []
    assert [w["how"] for w in snapshot["watched"]] == [event_counts.PLAIN]


def test_tensor_sources_are_grouped_not_kept_one_each():
    v = tf.Variable(1.0, name="v")
    with Recording() as recorder:
        for step in range(200):
            x = tf.constant(float(step))
            with tf.GradientTape() as tape:
                y = v * 2.0
            tape.gradient(y, [v, x])
    snapshot = recorder.snapshot()
    assert [(n["source"], n["reason"], n["count"])
            for n in snapshot["none_gradients"]] == [
                ("EagerTensor", explaining.NOT_WATCHED, 200)]
    assert [v["name"] for v in snapshot["variables"]] == ["v:0", "EagerTensor"]


def test_a_plain_gradient_source_in_replica_context_is_warned_about(strategy):
    """`w * outside` reads `outside` through TensorFlow's C++ fast path, which
    tells no Python function; the gradient call still names it."""
    outside = tf.Variable(1.0, name="outside")
    with strategy.scope():
        w = tf.Variable(2.0, name="w")

    def replica_step():
        with tf.GradientTape() as tape:
            loss = w * outside
        return tape.gradient(loss, [w, outside])

    with Recording() as recorder:
        strategy.run(replica_step)
    warnings = recorder.snapshot()["warnings"]
    gradient_line = replica_step.__code__.co_firstlineno + 3
    assert [(w["kind"], w["variable"], w["count"], w["location"])
            for w in warnings] == [
                (event_counts.REPLICA_PLAIN, "outside:0", 4,
                 f"{os.path.abspath(__file__)}:{gradient_line}")]


def test_a_keras_model_in_cross_replica_context_inside_a_tf_function(strategy):
    """A Keras 3 step under strategy.scope() without strategy.run, traced:
    reads count for the container (one component read), the totals and the
    one-device warning name the Keras paths."""
    keras = tf.keras
    if not hasattr(keras, "Variable") or issubclass(keras.Variable, tf.Variable):
        import pytest
        pytest.skip("Keras 3 variables need TensorFlow 2.16+")
    with strategy.scope():
        layer = keras.layers.Dense(1)
        layer.build((None, 2))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(tf.ones((1, 2))))
        return tape.gradient(loss, layer.trainable_variables)

    with Recording() as recorder:
        with strategy.scope():
            step()
    snapshot = recorder.snapshot()
    paths = sorted(variable.path for variable in layer.trainable_variables)
    assert sorted(v["name"] for v in snapshot["variables"]) == paths
    assert {(w["variable"], w["how"], w["context"]) for w in snapshot["watched"]} == {
        (path, event_counts.COMPONENT, "cross-replica") for path in paths}
    assert sorted((t["source"], t["components"])
                  for t in snapshot["total_derivatives"]) == [(path, 4) for path in paths]
    assert [w["kind"] for w in snapshot["warnings"]] == [event_counts.ONE_DEVICE]


def test_a_strategy_of_one_replica_gets_no_one_device_warning():
    """Found by the review: with one replica there is no other component to
    take part, and the loss was computed inside strategy.run: no warning
    (it said the step ran on one device, not on every replica)."""
    one_replica = tf.distribute.MirroredStrategy(
        DEVICES[:1], cross_device_ops=tf.distribute.ReductionToOneDevice())
    with one_replica.scope():
        v = tf.Variable(2.0)
    with Recording() as recorder:
        with one_replica.scope():
            with tf.GradientTape() as tape:
                loss = one_replica.reduce("SUM", one_replica.run(lambda: v * 3.0),
                                          axis=None)
            assert float(tape.gradient(loss, v)) == 3.0
    snapshot = recorder.snapshot()
    assert [(t["components"]) for t in snapshot["total_derivatives"]] == [1]
    assert snapshot["warnings"] == []
