"""A cross-replica gradient of a MirroredVariable: works with tfdtape,
raises in stock TensorFlow."""

import tensorflow as tf

from tfdtape import testing

strategy = testing.mirrored_strategy(2)
with strategy.scope():
    v = tf.Variable(3.0, name="v")
    with tf.GradientTape() as tape:
        loss = v.values[0] + 2.0 * v.values[1]
    print("gradient:", float(tape.gradient(loss, v)))
