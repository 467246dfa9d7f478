"""Run under `tfdtape launch -np N [--max-restarts K]`: Horovod's elastic
API resuming a job from its last commit, in one of two forms (the first
argument):

  fit   Horovod's tensorflow2_keras_mnist_elastic.py: a KerasState, its
        callbacks (epoch, batch, a commit per epoch) and `hvd.elastic.run`
        around `model.fit(epochs=EPOCHS - state.epoch)`;
  loop  a custom loop (DistributedGradientTape) under `hvd.elastic.run`
        that commits a TensorFlowKerasState at the end of every epoch.

Options after the form: --process-set (on 4 processes: two copies of the
job of 2, ranks [0, 1] and [2, 3], each a process set added with
`hvd.add_process_set` on every attempt, whose members all-reduce their
gradients within it; every rank ends with the same variables), --sync-bn (a
SyncBatchNormalization layer after the first Dense: statistics over every
process's batch).

Every rank starts from weights of its own (the first `sync()` hands out
rank 0's) and trains on its rows of each global batch; with AS_JOB_OF=N
and no launcher, one process trains from rank 0's weights on the global
batches of a job of N (the reference; commits go to TFDTAPE_LAUNCH_DIR).
FAULTS ends processes (tests/fault_points.py): at batch 1 of an epoch or
inside its first collective, right after the restore at the start of
`hvd.elastic.run`'s function, after training.
Prints one JSON object: the rank, the epochs this attempt ran, how many
times the reset callbacks ran, every model and optimizer variable.
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
ROWS = 6  # per rank and batch

hvd.init()
form, options = sys.argv[1], set(sys.argv[2:])
process_set = hvd.global_process_set
if "--process-set" in options:
    halves = [hvd.add_process_set([0, 1]), hvd.add_process_set([2, 3])]
    process_set = halves[hvd.rank() // 2]
as_job_of = int(os.environ.get("AS_JOB_OF", "0"))  # alone: one device, the global batches
rank = hvd.rank()
place = process_set.rank()  # this process's rows: its place in the job its set trains
size = as_job_of or process_set.size()
rng = np.random.default_rng(3)
features = rng.normal(size=(BATCHES * ROWS * size, 3)).astype(np.float32)
labels = features @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 1.0
share = ROWS * size if as_job_of else ROWS
mine = np.concatenate([np.arange(b * ROWS * size + place * ROWS, b * ROWS * size + place * ROWS
                                 + share) for b in range(BATCHES)])
dataset = tf.data.Dataset.from_tensor_slices((features[mine], labels[mine])).batch(share)
keras = tf.keras
normalized = [SyncBatchNormalization()] if "--sync-bn" in options else []
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), *normalized,
                          keras.layers.Activation("tanh"), keras.layers.Dense(1)])
dense_weights = [w for layer in model.layers if isinstance(layer, keras.layers.Dense)
                 for w in layer.weights]
for index, weight in enumerate(dense_weights):
    weight.assign(tf.random.stateless_normal(weight.shape, seed=(rank, index)))
epochs_run, resets = [], []


def optimizer_variables(optimizer):
    found = optimizer.variables
    return list(found() if callable(found) else found)


def report(state):
    variables = [*state.model.variables, *optimizer_variables(state.optimizer)]
    print(json.dumps({"rank": rank, "epochs": epochs_run, "resets": len(resets),
                      "variables": [np.asarray(v).tolist() for v in variables]}))


if form == "fit":
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9),
                                         process_set=process_set)
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(dataset.take(1), epochs=1, verbose=0)  # makes the optimizer's variables
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)

    class Probe(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            epochs_run.append(state.epoch)

        def on_train_batch_begin(self, batch, logs=None):
            if batch == 1:
                fault_points.at_batch(rank, state.epoch)

    callbacks = [Probe(), hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=1000)]

    @hvd.elastic.run
    def train(state):
        fault_points.reach(rank, "restore")
        state.model.fit(dataset, epochs=EPOCHS - state.epoch, callbacks=callbacks, verbose=0)
else:
    optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
    state = hvd.elastic.TensorFlowKerasState(model, optimizer, epoch=0)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        tape = hvd.DistributedGradientTape(tape, process_set=process_set)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))

    @hvd.elastic.run
    def train(state):
        fault_points.reach(rank, "restore")
        for epoch in range(state.epoch, EPOCHS):
            epochs_run.append(epoch)
            for batch, (x, y) in enumerate(dataset):
                if batch == 1:
                    fault_points.at_batch(rank, epoch)
                step(x, y)
            state.epoch = epoch + 1
            state.commit()

state.register_reset_callbacks([lambda: resets.append(1)])
train(state)
fault_points.reach(rank, "after")
report(state)
