"""tfdtape.explain: a reason in words for every None gradient, from real programs."""

import pytest
import tensorflow as tf

import tfdtape
from tfdtape import explaining as explain_lib
from tfdtape import testing


def only_reason(explanation):
    assert len(explanation.none_gradients) == 1, str(explanation)
    return explanation.none_gradients[0]


def test_not_watched_with_watch_accessed_variables_false():
    v = tf.Variable(2.0)
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        loss = v * v
    item = only_reason(tfdtape.explain(tape, loss, v))
    assert item.source is v
    assert item.reason == explain_lib.NOT_WATCHED
    assert "watch_accessed_variables=False" in item.message


def test_read_before_the_tape_started():
    v = tf.Variable(2.0)
    read_early = v.read_value()
    with tf.GradientTape() as tape:
        loss = read_early * read_early
    explanation = tfdtape.explain(tape, loss, [v])
    assert explanation.gradients == [None]
    assert only_reason(explanation).reason == explain_lib.NOT_READ
    assert str(explanation).startswith("ResourceVariable 'Variable:0': the tape "
                                       "never saw it read")


def test_watched_but_not_connected():
    v, w = tf.Variable(2.0), tf.Variable(3.0)
    with tf.GradientTape() as tape:
        loss = v * tf.stop_gradient(w.read_value())
    explanation = tfdtape.explain(tape, loss, {"v": v, "w": w})
    assert float(explanation.gradients["v"]) == 3.0
    item = only_reason(explanation)
    assert item.source is w and item.reason == explain_lib.NOT_CONNECTED


def test_created_outside_strategy_scope(strategy):
    outside = tf.Variable(2.0)
    read_early = outside.read_value()
    with strategy.scope():
        with tf.GradientTape() as tape:
            loss = read_early * 3.0
        item = only_reason(tfdtape.explain(tape, loss, outside))
    assert item.reason == explain_lib.CREATED_OUTSIDE_SCOPE
    assert "created outside strategy.scope()" in item.message


def test_container_watched_while_the_source_is_a_component(strategy):
    """In replica context the tape watches the container; another replica's
    component gets no gradient there."""
    with strategy.scope():
        v = tf.Variable(3.0)
    found = []

    def step():
        with tf.GradientTape() as tape:
            loss = v * v
        replica = tf.get_static_value(
            tf.distribute.get_replica_context().replica_id_in_sync_group)
        other = v.values[(replica + 1) % len(v.values)]
        found.append(only_reason(tfdtape.explain(tape, loss, other)))

    strategy.run(step)
    assert {item.reason for item in found} == {explain_lib.WATCHED_CONTAINER}
    assert found[0].message.startswith("the tape watched its container "
                                       "'Variable:0' (a MirroredVariable)")


def test_gradient_taken_in_the_wrong_context(strategy):
    """Recorded in cross-replica context, differentiated inside strategy.run:
    only the replica whose component was read gets a gradient."""
    with strategy.scope():
        v = tf.Variable(3.0)
        tape = tf.GradientTape(persistent=True)
        with tape:
            loss = v * v
    found = {}

    def step():
        replica = tf.get_static_value(
            tf.distribute.get_replica_context().replica_id_in_sync_group)
        found[int(replica)] = tfdtape.explain(tape, loss, v)

    strategy.run(step)
    assert float(found[0].gradients) == 6.0 and not found[0].none_gradients
    for replica in (1, 2, 3):
        assert only_reason(found[replica]).reason == explain_lib.WRONG_CONTEXT
    assert "take the gradient where the tape recorded" in str(found[1])


def test_a_used_tape_is_refused():
    v = tf.Variable(2.0)
    with tf.GradientTape() as tape:
        loss = v * v
    tape.gradient(loss, v)
    with pytest.raises(RuntimeError, match="cannot explain a used tape"):
        tfdtape.explain(tape, loss, v)


def test_keras_3_variables_are_explained_through_their_tf_variable():
    keras = tf.keras
    used, unused = keras.layers.Dense(1), keras.layers.Dense(1)
    x = tf.ones([2, 3])
    used(x), unused(x)  # build both
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(used(x)) + tf.reduce_sum(tf.stop_gradient(unused(x)))
    sources = used.trainable_variables + unused.trainable_variables
    explanation = tfdtape.explain(tape, loss, sources)
    assert [g is None for g in explanation.gradients] == [False, False, True, True]
    assert [item.source for item in explanation.none_gradients] == (
        unused.trainable_variables)
    # Read (watched as their tf.Variables) but cut off by stop_gradient.
    assert {item.reason for item in explanation.none_gradients} == {
        explain_lib.NOT_CONNECTED}
