"""Clipping inside the replicas, twice: TensorFlow's tutorial step with an
SGD clipped by its global norm, then model.fit with an Adam clipped by
value; MirroredStrategy over 2 virtual CPUs. Keras is first loaded here,
after TensorFlow."""

import numpy as np
import tensorflow as tf

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
features = np.linspace(-1.0, 1.0, 32, dtype=np.float32).reshape(8, 4)
labels = np.linspace(2.0, -2.0, 8, dtype=np.float32).reshape(8, 1)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.SGD(0.1, global_clipnorm=0.5)
batches = strategy.experimental_distribute_dataset(
    tf.data.Dataset.from_tensor_slices((features, labels)).batch(8))


@tf.function
def step(x, y):
    def replica(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum((model(x) - y) ** 2) / 8
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))  # APPLY
    strategy.run(replica, args=(x, y))


for _ in range(2):
    for x, y in batches:
        step(x, y)
with strategy.scope():
    model.compile(tf.keras.optimizers.Adam(clipvalue=0.5), "mse")
model.fit(features, labels, batch_size=8, epochs=2, verbose=0)
print("trained")
