"""What Keras 3's saving costs per epoch on several workers with tfdtape,
against stock Keras on one worker.

Two configurations, each a fresh launch per sample, alternating (their
order swapping every round): stock Keras in one process (tfdtape not
installed, no strategy), and tfdtape on a MultiWorkerMirroredStrategy of 2
processes (`tfdtape launch -np 2`) on one shared directory, where the chief
stages and renames its files and the other worker writes into a private
directory it removes. Each run trains an 8-layer Dense(256) model (about
0.5 M weights) for 4 epochs with BackupAndRestore, a weights
ModelCheckpoint and a whole-model ModelCheckpoint, and times the
callbacks' work at each epoch's end (the first epoch, which traces, is
left out). Reported: the median seconds per epoch of the saving on one
worker, on the chief and on the other worker, and chief / one worker.

Usage: python benchmarks/keras_saving.py [--samples 5]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

EPOCHS = 4
LAYERS = 8
WIDTH = 256


def run_job(directory):
    """Trains with the saving callbacks; prints the seconds each epoch's
    end spent saving (JSON), as the script's last line."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf
    if os.environ.get("TFDTAPE_AUTOINSTALL") != "0":
        import tfdtape  # noqa: F401 (installs)
    strategy = (tf.distribute.MultiWorkerMirroredStrategy() if "TF_CONFIG" in os.environ
                else tf.distribute.get_strategy())
    keras = tf.keras
    with strategy.scope():
        model = keras.Sequential([keras.Input((WIDTH,)), *[
            keras.layers.Dense(WIDTH, activation="relu") for _ in range(LAYERS)],
            keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, WIDTH)).astype(np.float32)
    y = rng.normal(size=(256, 1)).astype(np.float32)
    seconds, started = [], {}

    class Start(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            started["at"] = time.perf_counter()

    class Stop(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seconds.append(time.perf_counter() - started["at"])

    callbacks = [Start(), keras.callbacks.BackupAndRestore(os.path.join(directory, "backup"),
                                                           delete_checkpoint=False),
                 keras.callbacks.ModelCheckpoint(os.path.join(directory, "w.weights.h5"),
                                                 save_weights_only=True),
                 keras.callbacks.ModelCheckpoint(os.path.join(directory, "m.keras")), Stop()]
    model.fit(x, y, batch_size=64, epochs=EPOCHS, shuffle=False, verbose=0,
              callbacks=callbacks)
    print(json.dumps(seconds[1:]))


def sample(configuration):
    """{role: median seconds per epoch} of one fresh run."""
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_USE_LEGACY_KERAS="0")
    environment.pop("TF_CONFIG", None)
    with tempfile.TemporaryDirectory() as directory:
        command = [sys.executable, __file__, "--job", directory]
        if configuration == "stock, one worker":
            environment["TFDTAPE_AUTOINSTALL"] = "0"
        else:
            command = [sys.executable, "-m", "tfdtape", "launch", "-np", "2", *command]
        completed = subprocess.run(command, env=environment, capture_output=True, text=True,
                                   check=True)
    found = {}
    for line in completed.stdout.splitlines():
        prefix, _, text = line.rpartition("<stdout>:") if "<stdout>:" in line else ("", "", line)
        if text.startswith("["):
            role = {"": "one worker", "[0]": "chief", "[1]": "other worker"}[prefix]
            found[role] = statistics.median(json.loads(text))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--job")
    arguments = parser.parse_args()
    if arguments.job:
        return run_job(arguments.job)
    configurations = ["stock, one worker", "tfdtape, 2 workers"]
    found = {}
    for round_index in range(arguments.samples):
        order = configurations if round_index % 2 == 0 else configurations[::-1]
        for configuration in order:
            for role, seconds in sample(configuration).items():
                found.setdefault(role, []).append(seconds)
    medians = {role: statistics.median(values) for role, values in found.items()}
    for role, value in medians.items():
        print(f"{role:>13}: {value * 1000:7.1f} ms of saving per epoch "
              f"({len(found[role])} samples)")
    print(f"chief / one worker: {medians['chief'] / medians['one worker']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
