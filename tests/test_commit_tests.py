"""The two tests the commit added to backprop_test.py, ported to pytest.

They run in every configuration: without a strategy the commit changes
nothing, so all three must agree.
"""

import pytest
import tensorflow as tf

from assertions import assert_same_objects

pytestmark = pytest.mark.per_release


def test_automatic_watched_variables(configuration):
    with tf.GradientTape() as tape:
        assert len(tape.watched_variables()) == 0
        v = tf.Variable(1.0)
        loss = v * v
        assert_same_objects(tape.watched_variables(), [v])

        tape.reset()
        assert len(tape.watched_variables()) == 0
        loss += v * v
        assert_same_objects(tape.watched_variables(), [v])
    assert float(tape.gradient(loss, v)) == 2.0


def test_explicit_watched_variables(configuration):
    with tf.GradientTape() as tape:
        assert len(tape.watched_variables()) == 0
        v = tf.Variable(1.0)
        tape.watch(v)
        assert_same_objects(tape.watched_variables(), [v])

        tape.reset()
        assert len(tape.watched_variables()) == 0
        tape.watch(v)
        assert_same_objects(tape.watched_variables(), [v])
