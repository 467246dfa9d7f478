"""Run under `tfdtape launch -np N`: Horovod's tensorflow2_keras_mnist.py
shape with small local data: a Sequential model with no Input, which `fit`
builds, trained with DistributedOptimizer and BroadcastGlobalVariablesCallback
(Horovod broadcasts once the first batch has built it). Every rank starts
from its own random weights. Prints one JSON object: the rank and the
trained weights."""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import tensorflow as tf

import tfdtape.horovod.keras as hvd

hvd.init()
tf.keras.utils.set_random_seed(hvd.rank())
model = tf.keras.Sequential([tf.keras.layers.Dense(3, activation="relu"),
                             tf.keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)), loss="mse")
features = np.arange(24, dtype=np.float32).reshape(12, 2) / 24 + hvd.rank()
model.fit(features, features[:, :1], batch_size=4, epochs=2, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
print(json.dumps({"rank": hvd.rank(),
                  "weights": [np.asarray(w).tolist() for w in model.weights]}))
