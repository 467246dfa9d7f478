"""Run with -m: takes a gradient and prints how it was run."""

import sys

import tensorflow as tf

v = tf.Variable(2.0, name="module_v")
with tf.GradientTape() as tape:
    loss = v * v
print("gradient:", float(tape.gradient(loss, v)))
print("argv:", sys.argv)
print("name:", __name__)
