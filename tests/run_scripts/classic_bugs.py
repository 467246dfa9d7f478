"""The classic bugs tfdtape can see: a variable created outside
strategy.scope() trained inside strategy.run on MirroredStrategy(2), a
cross-replica gradient computed on one device, and a refusal of tfdtape's
that the script catches."""

import tensorflow as tf

import tfdtape
from tfdtape import testing

strategy = testing.mirrored_strategy(2)
outside = tf.Variable(1.0, name="outside")  # BUG: outside strategy.scope()
with strategy.scope():
    inside = tf.Variable(2.0, name="inside")


def replica_step():
    with tf.GradientTape() as tape:
        loss = outside.read_value() * inside  # READ
    grads = tape.gradient(loss, [outside, inside])
    outside.assign_sub(0.1 * grads[0])


strategy.run(replica_step)
with strategy.scope():
    with tf.GradientTape() as tape:
        loss = inside * 3.0
    tape.gradient(loss, inside)  # ONE DEVICE
try:
    tf.GradientTape().watch("a string")  # REFUSED
except tfdtape.NotWatchableError as error:
    print("caught:", type(error).__name__)
