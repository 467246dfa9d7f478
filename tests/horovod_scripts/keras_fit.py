"""Run under `tfdtape launch -np N [PASSES EPOCHS]`: Keras `fit` with
tfdtape.horovod.keras's DistributedOptimizer (accumulating PASSES backward
passes per step, default 1: mini-batches of 6 // PASSES of each rank's 6
rows) and callbacks, for EPOCHS (default 3), each rank starting from other
weights and training on its rows of the global batch; prints the weights,
the averaged losses and the optimizer's iterations as one JSON object."""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import tensorflow as tf

import tfdtape.horovod.keras as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
passes, epochs = map(int, sys.argv[1:3]) if len(sys.argv) > 2 else (1, 3)
features = np.arange(6 * size * 3, dtype=np.float32).reshape(6 * size, 3) / 10.0
labels = features @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 1.0
rows = slice(6 * rank, 6 * (rank + 1))
model = tf.keras.Sequential([
    tf.keras.Input((3,)),
    tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.Constant(float(rank)),
                          bias_initializer=tf.keras.initializers.Constant(float(rank)))])
model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1),
                                      backward_passes_per_step=passes), loss="mse")
history = model.fit(features[rows], labels[rows], batch_size=6 // passes, epochs=epochs,
                    shuffle=False,
                    verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                          hvd.callbacks.MetricAverageCallback()])
kernel, bias = model.get_weights()
print(json.dumps({"rank": rank, "weights": [kernel.ravel().tolist(), bias.tolist()],
                  "loss": history.history["loss"],
                  "optimizer": type(model.optimizer).__name__,
                  "iterations": int(model.optimizer.iterations)}), flush=True)
