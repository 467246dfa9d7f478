"""One None gradient of each cause explain knows, each on a line of its own
(the runner finds them by the CAUSE markers)."""

import tensorflow as tf

from tfdtape import testing

strategy = testing.mirrored_strategy(2)
with strategy.scope():
    v = tf.Variable(3.0, name="v")
plain = tf.Variable(2.0, name="plain")
x = tf.constant(1.0)

with tf.GradientTape(watch_accessed_variables=False) as tape:
    loss = plain * 2.0
tape.gradient(loss, plain)  # CAUSE: not watched

with tf.GradientTape() as tape:
    loss = x * 2.0
tape.gradient(loss, plain)  # CAUSE: not read while recording

frozen = tf.Variable(2.0, name="frozen", trainable=False)
with tf.GradientTape() as tape:
    loss = frozen * 2.0
tape.gradient(loss, frozen)  # CAUSE: not trainable

with tf.GradientTape() as tape:
    loss = tf.stop_gradient(plain * 2.0)
tape.gradient(loss, plain)  # CAUSE: not connected to the target


def other_component():
    with tf.GradientTape() as tape:
        loss = v * v
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    other = v.values[(tf.get_static_value(replica) + 1) % 2]
    return tape.gradient(loss, other)  # CAUSE: watched as the container


strategy.run(other_component)

with strategy.scope():
    cross_replica_tape = tf.GradientTape(persistent=True)
    with cross_replica_tape:
        loss = v * v


def wrong_context():
    return cross_replica_tape.gradient(loss, v)  # CAUSE: gradient taken in the wrong context


strategy.run(wrong_context)
