"""Run under `tfdtape launch -np N` (TF_USE_LEGACY_KERAS=1 for tf_keras):
hvd.SyncBatchNormalization against one device's BatchNormalization on the
global batch, which every rank also computes alone (plain Keras, no
tfdtape): the statistics of batches of r + 3 rows per rank, and three SGD
steps of a small model (4 rows per rank) by DistributedGradientTape, eagerly
and in a tf.function, and the same with Keras's own BatchNormalization (each
process's statistics: the control). Prints one JSON object per rank."""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import tensorflow as tf

import tfdtape.horovod as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
rows = np.random.default_rng(7).normal(2.0, 3.0, size=(sum(r + 3 for r in range(size)), 3))
rows = rows.astype(np.float32)
start = sum(r + 3 for r in range(rank))
found = {"keras": tf.keras.__name__ if hasattr(tf.keras, "__name__") else "keras"}

layer = hvd.SyncBatchNormalization(momentum=0.5)
layer(tf.constant(rows[start:start + rank + 3]), training=True)
alone = tf.keras.layers.BatchNormalization(momentum=0.5)
alone(tf.constant(rows), training=True)
found["statistics"] = [np.abs(layer.moving_mean.numpy() - alone.moving_mean.numpy()).max(),
                       np.abs(layer.moving_variance.numpy()
                              - alone.moving_variance.numpy()).max()]
found["statistics"] = [float(value) for value in found["statistics"]]
found["name"] = layer.name


def model(normalization):
    tf.keras.utils.set_random_seed(3)
    return tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(4),
                                normalization(momentum=0.5), tf.keras.layers.Dense(1)])


features = np.random.default_rng(8).normal(2.0, 3.0, size=(4 * size, 3)).astype(np.float32)
labels = features.sum(axis=1, keepdims=True) / 3.0


def train(net, x, y, distributed, traced):
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(net(x, training=True) - y))
        if distributed:
            tape = hvd.DistributedGradientTape(tape)
        gradients = tape.gradient(loss, net.trainable_variables)
        for variable, gradient in zip(net.trainable_variables, gradients):
            variable.assign_sub(0.1 * gradient)
    step = tf.function(step) if traced else step
    for _ in range(3):
        step()
    return [v.numpy() for v in net.weights]


for traced in (False, True):
    mine = slice(4 * rank, 4 * rank + 4)
    synced = train(model(hvd.SyncBatchNormalization), features[mine], labels[mine], True,
                   traced)
    reference = train(model(tf.keras.layers.BatchNormalization), features, labels, False,
                      traced)
    found["traced" if traced else "eager"] = [
        float(np.abs(a - b).max() / max(1.0, np.abs(b).max()))
        for a, b in zip(synced, reference)]
# The control: each process's own statistics (Keras's BatchNormalization).
unsynced = train(model(tf.keras.layers.BatchNormalization), features[mine], labels[mine],
                 True, False)
found["control"] = max(float(np.abs(a - b).max() / max(1.0, np.abs(b).max()))
                       for a, b in zip(unsynced, reference))
print(json.dumps(found), flush=True)
