"""One process of a job a cluster engine started (Slurm's srun, Open MPI's
mpirun, MPICH's mpiexec, a TFJob's TF_CONFIG), for tests/test_engines.py.
It trains a linear model for STEPS steps of SGD on GLOBAL_BATCH rows a step
and prints one JSON object: its place in the job and the weights.

    python tests/engine_process.py MODE
        horovod       tfdtape.horovod: hvd.init(), this rank's rows of every
                      global batch, DistributedGradientTape
        strategy      MultiWorkerMirroredStrategy() (no resolver), Keras 3 fit
                      on the global batches
        distribution  keras.distribution.initialize(), DataParallel(), fit
        reference     one device on the global batches (the oracle)
        backup        MultiWorkerMirroredStrategy(), fit for EPOCHS epochs with
                      BackupAndRestore in $ENGINE_DIR/backup; in a Slurm job's
                      first attempt (no SLURM_RESTART_COUNT), unless
                      ENGINE_NO_PAUSE is set, task 0 writes $ENGINE_DIR/paused
                      when epoch PAUSE_EPOCH begins and every task waits
                      there (for Slurm to end it); each task writes its
                      weights to $ENGINE_DIR/weights-TASK.json at the end
        ray           the same training on 2 Ray Train workers (the driver
                      here); worker 1 ends itself in the first attempt and
                      Ray restarts the group once
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np

GLOBAL_BATCH = 8
STEPS = 4
RATE = 0.1
RNG = np.random.default_rng(11)
FEATURES = RNG.normal(size=(STEPS * GLOBAL_BATCH, 3)).astype(np.float32)
LABELS = (FEATURES @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 0.25).astype(np.float32)


def model(keras):
    built = keras.Sequential([keras.Input((3,)), keras.layers.Dense(
        1, kernel_initializer="zeros", bias_initializer="zeros")])
    built.compile(optimizer=keras.optimizers.SGD(RATE), loss="mse")
    return built


def weights(built):
    """Every weight's values, flat, in order."""
    return np.concatenate([np.ravel(weight) for weight in built.get_weights()]).tolist()


def global_batches(tf):
    return tf.data.Dataset.from_tensor_slices((FEATURES, LABELS)).batch(GLOBAL_BATCH)


def horovod():
    import tensorflow as tf

    import tfdtape.horovod as hvd
    hvd.init()
    import keras
    built = model(keras)
    rows = GLOBAL_BATCH // hvd.size()
    for step in range(STEPS):
        start = step * GLOBAL_BATCH + hvd.rank() * rows
        x, y = FEATURES[start:start + rows], LABELS[start:start + rows]
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(built(x) - y))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, built.trainable_variables)
        built.optimizer.apply_gradients(zip(grads, built.trainable_variables))
    return {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
            "local_size": hvd.local_size(), "weights": weights(built)}


def strategy():
    import tensorflow as tf

    import tfdtape  # noqa: F401
    chosen = tf.distribute.MultiWorkerMirroredStrategy()
    import keras
    with chosen.scope():
        built = model(keras)
    built.fit(global_batches(tf), epochs=1, verbose=0, shuffle=False)
    resolver = chosen.cluster_resolver
    return {"task": [resolver.task_type, resolver.task_id],
            "replicas": chosen.num_replicas_in_sync, "weights": weights(built)}


def distribution():
    import keras
    import tensorflow as tf

    import tfdtape  # noqa: F401
    keras.distribution.initialize()
    keras.distribution.set_distribution(keras.distribution.DataParallel())
    built = model(keras)
    built.fit(global_batches(tf), epochs=1, verbose=0, shuffle=False)
    return {"replicas": tf.distribute.get_strategy().num_replicas_in_sync,
            "weights": weights(built)}


EPOCHS = 4
PAUSE_EPOCH = 2


def backup():
    """The Slurm form: task 0 marks the pause, every task waits there."""
    import time
    first_attempt = not os.environ.get("SLURM_RESTART_COUNT") and not os.environ.get(
        "ENGINE_NO_PAUSE")

    def pause(task, directory):
        if first_attempt:
            if task == 0:
                with open(os.path.join(directory, "paused"), "w") as marker:
                    marker.write(str(PAUSE_EPOCH))
            time.sleep(300)

    return train_with_backup(pause, int(os.environ.get("SLURM_RESTART_COUNT") or 0))


def train_with_backup(pause, restarts):
    """MultiWorkerMirroredStrategy(), fit with BackupAndRestore in
    $ENGINE_DIR/backup, `pause(task, directory)` as epoch PAUSE_EPOCH
    begins; each task's weights written to $ENGINE_DIR/weights-TASK.json."""
    import tensorflow as tf

    import tfdtape  # noqa: F401
    chosen = tf.distribute.MultiWorkerMirroredStrategy()
    import keras
    directory = os.environ["ENGINE_DIR"]
    task = chosen.cluster_resolver.task_id

    class Pause(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == PAUSE_EPOCH:
                pause(task, directory)

    with chosen.scope():
        built = model(keras)
    built.fit(global_batches(tf), epochs=EPOCHS, verbose=0, shuffle=False,
              callbacks=[keras.callbacks.BackupAndRestore(os.path.join(directory, "backup")),
                         Pause()])
    result = {"task": task, "restarts": restarts, "weights": weights(built)}
    with open(os.path.join(directory, f"weights-{task}.json"), "w") as written:
        json.dump(result, written)
    return result


def ray_worker_loop():
    """Ray Train's loop: in the first attempt (no $ENGINE_DIR/failed),
    unless ENGINE_NO_PAUSE is set, worker 1 ends its process with
    os._exit(1) as epoch PAUSE_EPOCH begins."""
    directory = os.environ["ENGINE_DIR"]
    failed = os.path.join(directory, "failed")
    restarts = int(os.path.exists(failed))

    def pause(task, _):
        if task == 1 and not restarts and not os.environ.get("ENGINE_NO_PAUSE"):
            with open(failed, "w") as marker:
                marker.write(str(PAUSE_EPOCH))
            os._exit(1)

    train_with_backup(pause, restarts)


def ray():
    """Runs ray_worker_loop on 2 Ray Train workers, restarting the group
    once (FailureConfig(max_failures=1))."""
    import ray as ray_module
    from ray.train import FailureConfig
    from ray.train import RunConfig
    from ray.train import ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer
    ray_module.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    directory = os.environ["ENGINE_DIR"]
    TensorflowTrainer(ray_worker_loop, scaling_config=ScalingConfig(num_workers=2),
                      run_config=RunConfig(storage_path=os.path.join(directory, "ray"),
                                           failure_config=FailureConfig(max_failures=1))
                      ).fit()
    ray_module.shutdown()
    return {"done": True}


def reference():
    import keras
    import tensorflow as tf
    built = model(keras)
    built.fit(global_batches(tf), epochs=1, verbose=0, shuffle=False)
    return {"weights": weights(built)}


if __name__ == "__main__":
    MODES = {"horovod": horovod, "strategy": strategy, "distribution": distribution,
             "reference": reference, "backup": backup, "ray": ray}
    print(json.dumps(MODES[sys.argv[1]]()), flush=True)
