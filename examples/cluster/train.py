"""A Keras 3 model trained with MultiWorkerMirroredStrategy on every process
its launcher started (srun, mpirun, mpiexec, a TFJob, Ray Train, tfdtape
launch), resuming from the backup in BACKUP_DIR (shared by every node) after
a restart. Each process prints its place in the job and the final loss."""

import os

import numpy as np
import tensorflow as tf

import tfdtape  # noqa: F401  (reads the job from the launcher)

strategy = tf.distribute.MultiWorkerMirroredStrategy()
import keras  # noqa: E402

GLOBAL_BATCH = 64
rng = np.random.default_rng(0)
features = rng.normal(size=(GLOBAL_BATCH * 50, 8)).astype("float32")
labels = (features @ rng.normal(size=(8, 1)) + 0.5).astype("float32")
data = tf.data.Dataset.from_tensor_slices((features, labels)).batch(GLOBAL_BATCH)

with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")

backup = os.environ.get("BACKUP_DIR", "/tmp/tfdtape-example-backup")
history = model.fit(data, epochs=5, verbose=0,
                    callbacks=[keras.callbacks.BackupAndRestore(backup)])
resolver = strategy.cluster_resolver
print(f"{resolver.task_type}:{resolver.task_id} of {strategy.num_replicas_in_sync} "
      f"replicas, final loss {history.history['loss'][-1]:.6f}")
