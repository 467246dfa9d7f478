"""Takes one gradient, then raises."""

import tensorflow as tf

v = tf.Variable(2.0, name="v")
with tf.GradientTape() as tape:
    loss = v * v
tape.gradient(loss, v)


def fail():
    raise RuntimeError("the training diverged")


fail()
