"""A correct MirroredStrategy(2) training loop: the tapes watch containers,
every gradient exists. Echoes stdin and its argv so the runner can check
them; exits with the status given as its first argument (default 0)."""

import sys

import tensorflow as tf

from tfdtape import testing

strategy = testing.mirrored_strategy(2)
with strategy.scope():
    kernel = tf.Variable([[0.5], [-0.5]], name="kernel")
    bias = tf.Variable([0.0], name="bias")
features = tf.constant([[1.0, 2.0]])


def step():
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.matmul(features, kernel) + bias)
    gradients = tape.gradient(loss, [kernel, bias])
    kernel.assign_sub(0.1 * gradients[0])
    bias.assign_sub(0.1 * gradients[1])


for _ in range(3):
    strategy.run(step)
print("stdin:", sys.stdin.read().strip())
print("argv:", sys.argv)
print("path0:", sys.path[0])
print("file:", __file__)
print("name:", __name__)
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
