"""A Keras subclassed model built at first call (two Dense layers whose
kernels TensorFlow names alike), trained for 3 steps with strategy.run in a
tf.function on MirroredStrategy(2); an unused Dense layer gets None
gradients."""

import tensorflow as tf

from tfdtape import testing

strategy = testing.mirrored_strategy(2)


class TwoLayers(tf.keras.Model):

    def __init__(self):
        super().__init__()
        self.hidden = tf.keras.layers.Dense(4)
        self.out = tf.keras.layers.Dense(1)
        self.unused = tf.keras.layers.Dense(1)

    def call(self, inputs):
        self.unused(inputs)  # built, but not part of the loss
        return self.out(self.hidden(inputs))


with strategy.scope():
    model = TwoLayers()
    model(tf.ones((1, 2)))
features = tf.ones((2, 2))


@tf.function
def train_step():
    def replica():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(features)) * 0.0 + tf.reduce_sum(
                model.out(model.hidden(features)))
        grads = tape.gradient(loss, model.trainable_variables)
        return [g for g in grads if g is not None]
    return strategy.run(replica)


for _ in range(3):
    train_step()
print("paths:", " ".join(v.path for v in model.trainable_variables))
