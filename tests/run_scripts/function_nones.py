"""None gradients inside tf.function steps (AutoGraph on), one in replica
context under strategy.run, one with no strategy; the runner finds their
lines by the NONE markers."""

import tensorflow as tf

from tfdtape import testing

strategy = testing.mirrored_strategy(2)
with strategy.scope():
    w = tf.Variable(3.0, name="w")
    unused = tf.Variable(1.0, name="unused")


def replica_step():
    with tf.GradientTape() as tape:
        loss = w * w
        if loss > 0:
            loss = loss * 2.0
    gradients = tape.gradient(loss, [w, unused])  # NONE: replica
    return gradients[0]


@tf.function
def distributed_step():
    return strategy.run(replica_step)


@tf.function
def plain_step(x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = x * 2.0
    return tape.gradient(loss, [x, unused])[0]  # NONE: no strategy


print("gradients:", [float(g) for g in strategy.experimental_local_results(
    distributed_step())], float(plain_step(tf.constant(1.0))))
