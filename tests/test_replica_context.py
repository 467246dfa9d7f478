"""Replica context: the tape watches the user's container, not a component.

Stock TensorFlow and tfdtape alone must watch the MirroredVariable itself;
the pre-seed control watches the replica's own component instead, which is
the difference the commit made. Gradients are the same in every configuration.
"""

import pytest
import tensorflow as tf

from assertions import assert_same_objects

pytestmark = pytest.mark.per_release

REPLICA_GRADIENTS = [6.0, 12.0, 18.0, 24.0]  # d(k * v * v)/dv at v=3, k=1..4


def expected_watched(configuration, variable, replica_id):
    """What the tape holds in replica `replica_id` for distributed `variable`."""
    if configuration == "pre_seed":
        return [variable.values[replica_id]]
    return [variable]


def replica_index():
    """The current replica's index as a Python int (also while tracing)."""
    replica_id = tf.distribute.get_replica_context().replica_id_in_sync_group
    return int(tf.get_static_value(replica_id))


def square_eagerly(v):
    return v * v


def make_square_in_function():
    """A fresh tf.function: one traced in another test would hold that test's
    variables in its graph, and mark those as read on every call."""
    return tf.function(lambda v: v * v, autograph=False)


READERS = {"eager read": lambda: square_eagerly,
           "traced read": make_square_in_function}


@pytest.mark.parametrize("traced_step", [False, True],
                         ids=["eager step", "tf.function step"])
@pytest.mark.parametrize("reader", sorted(READERS))
def test_automatic_watch_is_the_container(strategy, configuration, traced_step,
                                          reader):
    with strategy.scope():
        v = tf.Variable(3.0)
    watched = {}
    square = READERS[reader]()

    def step():
        replica_id = replica_index()
        with tf.GradientTape() as tape:
            loss = square(v) * float(replica_id + 1)
        watched[replica_id] = tape.watched_variables()
        return tape.gradient(loss, v)

    if traced_step:
        step = tf.function(step, autograph=False)
    gradients = strategy.run(step)
    assert sorted(watched) == [0, 1, 2, 3]
    for replica_id, found in watched.items():
        assert_same_objects(found, expected_watched(configuration, v, replica_id))
    assert [float(g) for g in strategy.experimental_local_results(gradients)] == (
        REPLICA_GRADIENTS)


def test_explicit_watch_is_the_container(strategy, configuration):
    """Explicit watch held the container even before the commit (the tape was
    handed the container itself), so here the control agrees; the cross-replica
    tests are where explicit watch discriminates."""
    with strategy.scope():
        v = tf.Variable(3.0)
    watched = {}

    def step():
        replica_id = replica_index()
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(v)
            loss = v * v * float(replica_id + 1)
        watched[replica_id] = tape.watched_variables()
        return tape.gradient(loss, v)

    gradients = strategy.run(step)
    assert sorted(watched) == [0, 1, 2, 3]
    for found in watched.values():
        assert_same_objects(found, [v])
    assert [float(g) for g in strategy.experimental_local_results(gradients)] == (
        REPLICA_GRADIENTS)


def test_watched_variables_after_reset(strategy, configuration):
    with strategy.scope():
        v = tf.Variable(3.0)
        w = tf.Variable(2.0)
    watched = {}

    def step():
        replica_id = replica_index()
        with tf.GradientTape() as tape:
            v * v
            tape.reset()
            loss = w * w
        watched[replica_id] = tape.watched_variables()
        return tape.gradient(loss, w)

    gradients = strategy.run(step)
    for replica_id, found in watched.items():
        assert_same_objects(found, expected_watched(configuration, w, replica_id))
    assert [float(g) for g in strategy.experimental_local_results(gradients)] == [
        4.0] * 4


def test_trainable_sync_on_read_variable(strategy, configuration):
    with strategy.scope():
        v = tf.Variable(3.0, trainable=True,
                        synchronization=tf.VariableSynchronization.ON_READ,
                        aggregation=tf.VariableAggregation.MEAN)
    watched = {}

    def step():
        replica_id = replica_index()
        with tf.GradientTape() as tape:
            loss = v * v
        watched[replica_id] = tape.watched_variables()
        return tape.gradient(loss, v)

    gradients = strategy.run(step)
    for replica_id, found in watched.items():
        assert_same_objects(found, expected_watched(configuration, v, replica_id))
    assert [float(g) for g in strategy.experimental_local_results(gradients)] == [
        6.0] * 4


def test_plain_variable_without_strategy(configuration):
    v = tf.Variable(3.0)
    with tf.GradientTape() as tape:
        loss = make_square_in_function()(v)
    assert_same_objects(tape.watched_variables(), [v])
    assert float(tape.gradient(loss, v)) == 6.0
