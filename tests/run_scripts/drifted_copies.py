"""A MirroredStrategy(2) training loop whose kernel's second copy is
updated on its own (a per-replica update): its copies differ at the end.
With `healthy` as the argument, no per-replica update: nothing differs."""

import sys

import numpy as np
import tensorflow as tf

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
features = np.linspace(-1.0, 1.0, 32, dtype=np.float32).reshape(8, 4)
labels = np.linspace(2.0, -2.0, 8, dtype=np.float32).reshape(8, 1)


def main():
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
        model.compile(tf.keras.optimizers.SGD(0.1), "mse")
    model.fit(features, labels, batch_size=8, epochs=2, verbose=0)
    if sys.argv[1:] != ["healthy"]:
        kernel = model.trainable_variables[0]
        # Keras 3 wraps the MirroredVariable (its .value); Keras 2's is it.
        mirrored = kernel if callable(kernel.value) else kernel.value
        strategy.experimental_local_results(mirrored)[1].assign_add(
            tf.fill((4, 1), 0.25))  # PER-REPLICA UPDATE
    return model


MODEL = main()
print("trained")
