"""A custom training loop that survives a restart: TensorFlow's
multi-worker tutorial's `tf.train.CheckpointManager` (the chief saves into
DIRECTORY, every other worker into a directory of its own that it removes,
as the tutorial does), with the tape around `strategy.run` (tfdtape).

Run by tests/test_checkpoint_loop.py under `tfdtape launch -np N
[--max-restarts K]` (TF_CONFIG set: MultiWorkerMirroredStrategy, each
worker its rows of every global batch), or alone (the one-device reference
on the global batches). FAULTS ends processes (tests/fault_points.py): at
batch 1 of an epoch, inside
an epoch's save (its checkpoint written, the manager's state not yet),
right after the restore, after the final save.
Prints one JSON object: the rank, the epochs this process ran, every model
and optimizer variable.
"""

import json
import os
import shutil
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import tensorflow as tf

import fault_points
import tfdtape  # noqa: F401 (installs)

EPOCHS = 4
BATCHES = 4
GLOBAL_BATCH = 12


def main():
    directory = sys.argv[1]
    if "TF_CONFIG" in os.environ:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        rank, workers = strategy.cluster_resolver.task_id, strategy.num_replicas_in_sync
    else:
        strategy, rank, workers = tf.distribute.get_strategy(), 0, 1
    rng = np.random.default_rng(6)
    features = rng.normal(size=(BATCHES * GLOBAL_BATCH, 3)).astype(np.float32)
    labels = features @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 1.0
    share = GLOBAL_BATCH // workers
    rows = np.concatenate([np.arange(b * GLOBAL_BATCH + rank * share,
                                     b * GLOBAL_BATCH + (rank + 1) * share)
                           for b in range(BATCHES)])
    local = tf.data.Dataset.from_tensor_slices((features[rows], labels[rows])).batch(share)
    dataset = strategy.distribute_datasets_from_function(lambda _: local) if workers > 1 \
        else local
    keras = tf.keras
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                                  keras.layers.Dense(1)])
        for index, weight in enumerate(model.weights):
            weight.assign(tf.random.stateless_normal(weight.shape, seed=(9, index)))
        optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
        optimizer.build(model.trainable_variables)
        epoch = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=epoch)
    chief = rank == 0
    writing = directory if chief else tempfile.mkdtemp()  # TensorFlow's tutorial
    manager = tf.train.CheckpointManager(checkpoint, writing, max_to_keep=1)
    checkpoint.restore(tf.train.latest_checkpoint(directory))  # None: nothing to restore
    fault_points.reach(rank, "restore")
    record_state = manager._record_state

    def record_state_unless_dying():  # CheckpointManager.save: write, then the state
        fault_points.reach(rank, "save", int(epoch.numpy()) - 1)
        record_state()

    manager._record_state = record_state_unless_dying

    def replica_loss(x, y):
        return tf.reduce_sum((model(x) - y) ** 2) / GLOBAL_BATCH

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:  # around strategy.run: tfdtape
            loss = strategy.reduce("SUM", strategy.run(replica_loss, args=(x, y)), axis=None)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))

    epochs_run = []
    for current in range(int(epoch.numpy()), EPOCHS):
        epochs_run.append(current)
        for batch, (x, y) in enumerate(dataset):
            if batch == 1:
                fault_points.at_batch(rank, current)
            step(x, y)
        epoch.assign_add(1)
        manager.save()
    if not chief:
        shutil.rmtree(writing)
    fault_points.reach(rank, "after")
    variables = [*model.variables, *optimizer.variables]
    print(json.dumps({"rank": rank, "epochs": epochs_run, "variables": [
        np.asarray(strategy.experimental_local_results(getattr(v, "value", v))[0]).tolist()
        for v in variables]}))


if __name__ == "__main__":
    main()
