"""A healthy run of a model with 160 variables (80 Dense layers), trained for
5 steps with strategy.run in a tf.function on MirroredStrategy(2)."""

import tensorflow as tf

from tfdtape import testing

strategy = testing.mirrored_strategy(2)
with strategy.scope():
    model = tf.keras.Sequential(
        [tf.keras.layers.Dense(2) for _ in range(80)])
    model(tf.ones((1, 2)))
features = tf.ones((2, 2))


@tf.function
def train_step():
    def replica():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(features))
        grads = tape.gradient(loss, model.trainable_variables)
        for variable, grad in zip(model.trainable_variables, grads):
            variable.assign_sub(0.001 * grad)
    strategy.run(replica)


for _ in range(5):
    train_step()
print("variables:", len(model.trainable_variables))
