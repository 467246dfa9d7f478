"""A Keras 3 `fit` that backs up, checkpoints and saves, and may be killed.

Run by tests/test_keras_saving.py, one process per worker under `tfdtape
launch` (TF_CONFIG set: MultiWorkerMirroredStrategy), or alone (the
one-device reference on the global batch). Arguments: DIRECTORY, where the
job writes (every worker the same paths, unless --backup-per-rank), and

  --die RANK:EPOCH:HOW   on attempt 0 (TFDTAPE_RESTART_COUNT), process RANK
                         ends as batch 1 of epoch EPOCH begins (HOW: exit,
                         os._exit(3); kill, SIGKILL), or, with HOW write,
                         while writing the backup at the end of epoch EPOCH
                         (a partial file, then os._exit(3)), or, with HOW
                         after, once the job has saved its final files
                         (os._exit(3))
  --per-rank             each worker writes under DIRECTORY/rank-RANK (as on
                         disks of their own)
  --legacy               tf_keras (its own callbacks), no export; the chief
                         alone saves at the end (TensorFlow's tutorial)
  --stock-saving         Keras's own saving functions and callbacks put back
                         (tfdtape's keras3_saving off: the control)
  --forget-finished      keep no copy of an ended fit's backup for a restarted
                         attempt (keras3_finished_training off: the control)

--die is a fault of tests/fault_points.py; FAULTS in the environment plans
more: at batch 1 of an epoch, inside an epoch's backup write, inside the
backup's restore (its weights loaded, before the epoch is read), after the
final files.

Callbacks: BackupAndRestore(DIRECTORY/backup), ModelCheckpoint
(DIRECTORY/ckpt-{epoch:02d}.weights.h5, weights only) and ModelCheckpoint
(DIRECTORY/best.keras, save_best_only); after `fit`: model.save
(final.keras), model.save_weights (final.weights.h5), model.export
(exported). Prints JSON: the rank, the epochs this process ran, every
variable's first copy (the model's, then the optimizer's).
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf

import fault_points
import tfdtape  # noqa: F401  (installs)

GLOBAL_BATCH = 12
STEPS = 4
EPOCHS = 4
RNG = np.random.default_rng(5)
FEATURES = RNG.normal(size=(STEPS * GLOBAL_BATCH, 4)).astype(np.float32)
LABELS = RNG.normal(size=(STEPS * GLOBAL_BATCH, 1)).astype(np.float32)


def build(keras):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"),
                              keras.layers.Dense(1)])
    for index, weight in enumerate(model.weights):
        weight.assign(tf.random.stateless_normal(weight.shape, seed=(7, index)) * 0.5)
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse")
    return model


def first_copy(variable):
    value = variable if isinstance(variable, tf.Variable) else variable.value  # Keras 3's
    if isinstance(value, tf.distribute.DistributedValues):
        value = value._values[0]
    return np.asarray(value).tolist()


DIE_AS = {"exit": ("batch", "exit"), "kill": ("batch", "kill"), "write": ("save", "exit"),
          "after": ("after", "exit")}
"""--die's HOW as a fault of tests/fault_points.py: (moment, way)."""


def plan_die(spec):
    """Plans --die RANK:EPOCH:HOW for attempt 0."""
    rank, epoch, how = spec.split(":")
    moment, way = DIE_AS[how]
    fault_points.plan(fault_points.spec(
        0, int(rank), moment, fault_points.ANY_EPOCH if moment == "after" else int(epoch), way))


def callbacks_of(keras, directory, epochs_run, rank):
    backup = os.path.join(directory, "backup")
    epoch_now = {}

    class Probe(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            epochs_run.append(epoch)
            epoch_now["epoch"] = epoch

        def on_train_batch_begin(self, batch, logs=None):
            if batch == 1:
                fault_points.at_batch(rank, epoch_now["epoch"])

    backup_callback = keras.callbacks.BackupAndRestore(backup)
    planned = fault_points.planned(rank)
    if any(m == "save" for m, _ in planned):
        save_weights = keras.Model.save_weights

        def partial_then_die(model, filepath, *args, **kwargs):
            way = fault_points.due(rank, "save", epoch_now["epoch"])
            if "latest" in str(filepath) and way:
                if rank == 0:  # the chief writes the job's backup; the others' go nowhere
                    with open(filepath, "wb") as file:
                        file.write(b"\x89HDF\r\n\x1a\n partial")
                fault_points.end(way)
            return save_weights(model, filepath, *args, **kwargs)

        keras.Model.save_weights = partial_then_die
    if any(m == "restore" for m, _ in planned):
        load_weights = keras.Model.load_weights

        def load_then_die(model, filepath, *args, **kwargs):
            loaded = load_weights(model, filepath, *args, **kwargs)
            if os.path.basename(str(filepath)) == "latest.weights.h5":  # the backup's
                fault_points.reach(rank, "restore")  # (tfdtape's private copy of it)
            return loaded

        keras.Model.load_weights = load_then_die
    return [Probe(), backup_callback,
            keras.callbacks.ModelCheckpoint(os.path.join(directory, "ckpt-{epoch:02d}.weights.h5"),
                                            save_weights_only=True),
            keras.callbacks.ModelCheckpoint(os.path.join(directory, "best.keras"),
                                            monitor="loss", save_best_only=True)]


def stock_saving():
    """Puts Keras's own saving functions and callbacks back in place."""
    import keras.callbacks  # noqa: F401  (loads the modules holding the targets)
    import keras.models  # noqa: F401
    import keras.saving  # noqa: F401

    from tfdtape import keras3_saving
    from tfdtape import patching
    from tfdtape import targets
    patching.install()  # the targets of the modules just loaded
    for target in targets.patch_targets():
        replacement = target.current()
        code = getattr(replacement, "__code__", None)  # wraps() copied Keras's __module__
        if code is not None and code.co_filename == keras3_saving.__file__:
            setattr(target.owner, target.attribute, targets.original_of(replacement))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("--die")
    parser.add_argument("--per-rank", action="store_true")
    parser.add_argument("--legacy", action="store_true")
    parser.add_argument("--stock-saving", action="store_true")
    parser.add_argument("--forget-finished", action="store_true")
    arguments = parser.parse_args()
    keras = tf.keras
    if arguments.stock_saving:
        stock_saving()
    if arguments.forget_finished:
        from tfdtape import keras3_finished_training
        keras3_finished_training.remember = lambda callback: None
    rank, strategy = 0, tf.distribute.get_strategy()
    if "TF_CONFIG" in os.environ:
        rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    if arguments.die:
        plan_die(arguments.die)
    directory = arguments.directory
    if arguments.per_rank:
        directory = os.path.join(directory, f"rank-{rank}")
        os.makedirs(directory, exist_ok=True)
    epochs_run = []
    with strategy.scope():
        model = build(keras)
    model.fit(FEATURES, LABELS, batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False,
              verbose=0, callbacks=callbacks_of(keras, directory, epochs_run, rank))
    if arguments.legacy and rank != 0:  # TensorFlow's tutorial: tf_keras's save races
        directory = tempfile.mkdtemp()
    model.save(os.path.join(directory, "final.keras"))
    model.save_weights(os.path.join(directory, "final.weights.h5"))
    if arguments.legacy and rank != 0:
        shutil.rmtree(directory)
    if not arguments.legacy:
        model.export(os.path.join(directory, "exported"), verbose=False)
    fault_points.reach(rank, "after")
    optimizer_variables = model.optimizer.variables
    if callable(optimizer_variables):  # tf_keras
        optimizer_variables = optimizer_variables()
    variables = [*model.weights, *optimizer_variables]
    print(json.dumps({"rank": rank, "epochs": epochs_run,
                      "variables": [first_copy(v) for v in variables]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
