"""None gradients inside tf.function steps (AutoGraph on), one per case;
the runner finds their lines by the NONE markers. The to_graph case runs
code converted by tf.autograph.to_graph outside any conversion under way,
which no source map covers: its location is '?'. The last, eager, spreads
one call over two lines: it is located at the statement's first line, as
a multi-line call under AutoGraph is."""

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


@tf.function
def multiline_step(x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = x * 3.0
    return tape.gradient(  # NONE: multiline
        loss,
        [x, unused])[0]


@tf.function
def nested_step():
    def nested_replica_step():
        with tf.GradientTape() as tape:
            loss = w * 5.0
        return tape.gradient(loss, [w, unused])[0]  # NONE: nested replica
    return strategy.run(nested_replica_step)


plain = tf.Variable(1.0, name="plain")
plain_unused = tf.Variable(1.0, name="plain_unused")


def to_graph_step():
    with tf.GradientTape() as tape:
        loss = plain * 7.0
    return tape.gradient(loss, [plain, plain_unused])[0]


print("gradients:", [float(g) for g in strategy.experimental_local_results(
    distributed_step())], float(plain_step(tf.constant(1.0))),
      float(multiline_step(tf.constant(1.0))),
      [float(g) for g in strategy.experimental_local_results(nested_step())])
print("to_graph:", float(tf.autograph.to_graph(to_graph_step)()))
with tf.GradientTape() as tape:
    loss = plain * 2.0
(tape  # NONE: eager chain
 .gradient(loss, [plain, plain_unused]))
