"""Keras 3's distribution API as its guide writes it: a DataParallel over
every device set, then a model built, compiled and fit; 2 virtual CPUs.
Without tfdtape, Keras on TensorFlow trains it on one device."""

import numpy as np
import tensorflow as tf

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
import keras  # noqa: E402 (after the devices are laid out)

keras.distribution.set_distribution(
    keras.distribution.DataParallel(devices=keras.distribution.list_devices()))
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)], name="guide_model")
model.compile(keras.optimizers.SGD(0.1), "mse")
features = np.linspace(-1.0, 1.0, 32, dtype=np.float32).reshape(8, 4)
model.fit(features, features[:, :1], batch_size=8, epochs=2, verbose=0)  # FIT
copies = getattr(model.weights[0].value, "values", [model.weights[0].value])
print(f"trained with {len(copies)} copies")
