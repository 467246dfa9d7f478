"""Run under `tfdtape launch -np N [--max-restarts K]`: Horovod's elastic
API resuming a job from its last commit, in one of two forms (the first
argument):

  fit   Horovod's tensorflow2_keras_mnist_elastic.py: a KerasState, its
        callbacks (epoch, batch, a commit per epoch) and `hvd.elastic.run`
        around `model.fit(epochs=EPOCHS - state.epoch)`;
  loop  a custom loop (DistributedGradientTape) under `hvd.elastic.run`
        that commits a TensorFlowKerasState at the end of every epoch.

Every rank starts from weights of its own (the first `sync()` hands out
rank 0's) and trains on its rows of each global batch; with AS_JOB_OF=N
and no launcher, one process trains from rank 0's weights on the global
batches of a job of N (the reference; commits go to TFDTAPE_LAUNCH_DIR). With FAIL=RANK:EPOCH
in the environment, on the launch's first attempt (TFDTAPE_RESTART_COUNT
0) process RANK ends with os._exit(3) as batch 1 of epoch EPOCH begins.
Prints one JSON object: the rank, the epochs this attempt ran, how many
times the reset callbacks ran, every model and optimizer variable.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import tensorflow as tf

import tfdtape.horovod.keras as hvd

EPOCHS = 4
BATCHES = 4
ROWS = 6  # per rank and batch

hvd.init()
form = sys.argv[1]
as_job_of = int(os.environ.get("AS_JOB_OF", "0"))  # alone: one device, the global batches
rank, size = hvd.rank(), as_job_of or hvd.size()
rng = np.random.default_rng(3)
features = rng.normal(size=(BATCHES * ROWS * size, 3)).astype(np.float32)
labels = features @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 1.0
share = ROWS * size if as_job_of else ROWS
mine = np.concatenate([np.arange(b * ROWS * size + rank * ROWS, b * ROWS * size + rank * ROWS
                                 + share) for b in range(BATCHES)])
dataset = tf.data.Dataset.from_tensor_slices((features[mine], labels[mine])).batch(share)
failing = os.environ.get("FAIL") if os.environ.get("TFDTAPE_RESTART_COUNT") == "0" else None
fail_rank, fail_epoch = map(int, failing.split(":")) if failing else (None, None)

keras = tf.keras
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                          keras.layers.Dense(1)])
for index, weight in enumerate(model.weights):
    weight.assign(tf.random.stateless_normal(weight.shape, seed=(rank, index)))
epochs_run, resets = [], []


def fault(epoch, batch):
    if rank == fail_rank and epoch == fail_epoch and batch == 1:
        sys.stdout.flush()
        os._exit(3)


def optimizer_variables(optimizer):
    found = optimizer.variables
    return list(found() if callable(found) else found)


def report(state):
    variables = [*state.model.variables, *optimizer_variables(state.optimizer)]
    print(json.dumps({"rank": rank, "epochs": epochs_run, "resets": len(resets),
                      "variables": [np.asarray(v).tolist() for v in variables]}))


if form == "fit":
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9))
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(dataset.take(1), epochs=1, verbose=0)  # makes the optimizer's variables
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)

    class Probe(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            epochs_run.append(state.epoch)

        def on_train_batch_begin(self, batch, logs=None):
            fault(state.epoch, batch)

    callbacks = [Probe(), hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=1000)]

    @hvd.elastic.run
    def train(state):
        state.model.fit(dataset, epochs=EPOCHS - state.epoch, callbacks=callbacks, verbose=0)
else:
    optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
    state = hvd.elastic.TensorFlowKerasState(model, optimizer, epoch=0)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        tape = hvd.DistributedGradientTape(tape)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))

    @hvd.elastic.run
    def train(state):
        for epoch in range(state.epoch, EPOCHS):
            epochs_run.append(epoch)
            for batch, (x, y) in enumerate(dataset):
                fault(epoch, batch)
                step(x, y)
            state.epoch = epoch + 1
            state.commit()

state.register_reset_callbacks([lambda: resets.append(1)])
train(state)
report(state)
