"""Run under `tfdtape launch -np N [--max-restarts K]` with a directory:
Horovod's keras_mnist_advanced.py way of surviving a restart. Rank 0 alone
checkpoints the whole model every epoch (ModelCheckpoint); at start rank 0
looks for the last checkpoint, `hvd.broadcast` tells every rank its epoch,
rank 0 resumes with `hvd.load_model` (the optimizer's state too), the
others build the model afresh, and BroadcastGlobalVariablesCallback hands
out rank 0's variables. With --sync-bn after the directory, the model has a
SyncBatchNormalization layer after its first Dense. FAULTS ends processes
(tests/fault_points.py): at batch 1 of an epoch or inside its first
collective, right after the resume (rank 0's checkpoint loaded), after
`fit`.
Prints one JSON object: the rank, the epochs this attempt ran, every model
and optimizer variable.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import tensorflow as tf

import fault_points
import tfdtape.horovod.keras as hvd
from tfdtape.horovod import SyncBatchNormalization

EPOCHS = 4
BATCHES = 4
ROWS = 6

hvd.init()
directory, options = sys.argv[1], set(sys.argv[2:])
checkpoint_format = os.path.join(directory, "checkpoint-{epoch}.keras")
rank, size = hvd.rank(), hvd.size()
rng = np.random.default_rng(4)
features = rng.normal(size=(BATCHES * ROWS * size, 3)).astype(np.float32)
labels = features @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 1.0
mine = np.concatenate([np.arange(b * ROWS * size + rank * ROWS, b * ROWS * size + (rank + 1) * ROWS)
                       for b in range(BATCHES)])

resume_from_epoch = 0
for try_epoch in range(EPOCHS, 0, -1):
    if os.path.exists(checkpoint_format.format(epoch=try_epoch)):
        resume_from_epoch = try_epoch
        break
resume_from_epoch = int(hvd.broadcast(resume_from_epoch, 0, name="resume_from_epoch"))
keras = tf.keras
if resume_from_epoch > 0 and rank == 0:
    model = hvd.load_model(checkpoint_format.format(epoch=resume_from_epoch))
else:
    normalized = [SyncBatchNormalization()] if "--sync-bn" in options else []
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), *normalized,
                              keras.layers.Activation("tanh"), keras.layers.Dense(1)])
    for index, weight in enumerate([w for layer in model.layers
                                    if isinstance(layer, keras.layers.Dense)
                                    for w in layer.weights]):
        weight.assign(tf.random.stateless_normal(weight.shape, seed=(rank, index)))
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)),
                  loss="mse")
fault_points.reach(rank, "restore")
epochs_run = []


class Probe(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        epochs_run.append(epoch)
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if batch == 1:
            fault_points.at_batch(rank, self.epoch)


callbacks = [Probe(), hvd.callbacks.BroadcastGlobalVariablesCallback(0),
             hvd.callbacks.MetricAverageCallback()]
if rank == 0:
    callbacks.append(keras.callbacks.ModelCheckpoint(checkpoint_format))
model.fit(features[mine], labels[mine], batch_size=ROWS, shuffle=False, callbacks=callbacks,
          epochs=EPOCHS, initial_epoch=resume_from_epoch, verbose=0)
fault_points.reach(rank, "after")
optimizer_variables = model.optimizer.variables
optimizer_variables = optimizer_variables() if callable(optimizer_variables) else \
    optimizer_variables
print(json.dumps({"rank": rank, "epochs": epochs_run, "variables": [
    np.asarray(v).tolist() for v in [*model.variables, *optimizer_variables]]}))
