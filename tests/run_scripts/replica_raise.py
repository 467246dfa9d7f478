"""Raises inside a replica function: eagerly (argv[1] == 'eager') or in a
tf.function."""

import sys

import tensorflow as tf

from tfdtape import testing

strategy = testing.mirrored_strategy(2)
with strategy.scope():
    v = tf.Variable(1.0, name="v")


def replica():
    with tf.GradientTape() as tape:
        loss = v * v
    tf.debugging.assert_equal(loss, 2.0, message="loss is not 2")
    return tape.gradient(loss, v)


def run_once():
    return strategy.run(replica)


if sys.argv[1:] == ["eager"]:
    run_once()
else:
    tf.function(run_once)()
