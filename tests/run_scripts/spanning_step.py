"""The loop most people write first, on MirroredStrategy(2): the tape around
strategy.run, the gradient and apply_gradients outside it. Two eager steps
under strategy.scope(), then one tf.function step with no scope around it."""

import sys

import tensorflow as tf

from tfdtape import testing

strategy = testing.mirrored_strategy(2)
with strategy.scope():
    layer = tf.keras.layers.Dense(1, kernel_initializer="ones", name="head")
    layer.build((None, 2))
    optimizer = tf.keras.optimizers.SGD(0.1)
    optimizer.build(layer.trainable_variables)
KERAS_2 = isinstance(layer.kernel, tf.Variable)
features = strategy.experimental_distribute_values_from_function(
    lambda context: tf.fill((1, 2), float(context.replica_id_in_sync_group + 1)))


def step():
    with tf.GradientTape() as tape:
        per_replica = strategy.run(lambda x: tf.reduce_sum(layer(x)), args=(features,))
        loss = strategy.reduce("SUM", per_replica, axis=None)
    gradients = tape.gradient(loss, layer.trainable_variables)  # SPANNING
    optimizer.apply_gradients(zip(gradients, layer.trainable_variables),
                              **({"skip_gradients_aggregation": True} if KERAS_2 else {}))


with strategy.scope():
    step()
    step()
tf.function(step)()
kernel = layer.kernel if KERAS_2 else layer.kernel.value
copies = [[round(x, 5) for x in c.numpy().ravel().tolist()] for c in kernel.values]
print("kernel", copies[0], "replicas identical", copies[0] == copies[1])
sys.exit(0)
