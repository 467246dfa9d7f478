"""What training through Keras 3's distribution API costs with tfdtape,
against the same `model.fit` under a MirroredStrategy written by hand.

Two configurations, both with tfdtape over 2 virtual CPUs: `keras.distribution
.set_distribution(DataParallel(devices=list_devices()))` before the model is
built, and `with tf.distribute.MirroredStrategy(...).scope():` around the
build and compile. One fresh process per sample, the configurations
alternating (their order swapping every round); each process trains an
8-layer Dense(64) model with SGD for one epoch to trace and warm up, then
times a second epoch of `--steps` steps. Reported: the median seconds per
step of each, and DataParallel / MirroredStrategy, of the medians and as
the median of each round's ratio (target <= 1.02).

Usage: python benchmarks/keras_distribution.py [--samples 6] [--steps 60]
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

CONFIGURATIONS = ("DataParallel", "MirroredStrategy")
GLOBAL_BATCH = 64
WIDTH = 64
LAYERS = 8


def sample(configuration, steps):
    """Seconds per step of the timed epoch, in this (fresh) process."""
    import contextlib

    import tfdtape
    from tfdtape import testing

    devices = testing.virtual_cpus(2)
    import keras
    import numpy as np
    import tensorflow as tf

    if not tfdtape.is_installed():
        raise RuntimeError("tfdtape is not installed in the sample")
    if configuration == "DataParallel":
        keras.distribution.set_distribution(
            keras.distribution.DataParallel(devices=keras.distribution.list_devices()))
        scope = contextlib.nullcontext()
    else:
        scope = tf.distribute.MirroredStrategy(devices).scope()
    with scope:
        model = keras.Sequential([keras.Input((WIDTH,))] + [
            keras.layers.Dense(WIDTH, activation="tanh") for _ in range(LAYERS)] + [
            keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.01), loss="mse")
    if len(model.weights[0].value.values) != 2:
        raise RuntimeError(f"{configuration}: the model is not mirrored on 2 devices")
    rng = np.random.default_rng(0)
    features = rng.normal(size=(steps * GLOBAL_BATCH, WIDTH)).astype(np.float32)
    labels = rng.normal(size=(steps * GLOBAL_BATCH, 1)).astype(np.float32)
    model.fit(features, labels, batch_size=GLOBAL_BATCH, epochs=1, verbose=0)
    start = time.perf_counter()
    model.fit(features, labels, batch_size=GLOBAL_BATCH, epochs=1, verbose=0)
    return (time.perf_counter() - start) / steps


def run_sample(configuration, steps):
    completed = subprocess.run(
        [sys.executable, __file__, "--sample", configuration, "--steps", str(steps)],
        capture_output=True, text=True, check=False,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    if completed.returncode != 0:
        raise RuntimeError(f"{configuration} failed:\n{completed.stderr[-2000:]}")
    return float(completed.stdout.split()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=6)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--sample", choices=CONFIGURATIONS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sample:
        print(sample(args.sample, args.steps))
        return
    seconds = {configuration: [] for configuration in CONFIGURATIONS}
    for index in range(args.samples):
        order = CONFIGURATIONS if index % 2 == 0 else CONFIGURATIONS[::-1]
        for configuration in order:
            seconds[configuration].append(run_sample(configuration, args.steps))
    medians = {configuration: statistics.median(found)
               for configuration, found in seconds.items()}
    print(f"model.fit over 2 virtual CPUs, {LAYERS} Dense({WIDTH}) layers, global batch "
          f"{GLOBAL_BATCH}, SGD; median ms per step of {args.samples} fresh processes each")
    for configuration in CONFIGURATIONS:
        spread = ", ".join(f"{value * 1e3:.2f}" for value in sorted(seconds[configuration]))
        print(f"{configuration:>17}: {medians[configuration] * 1e3:.2f} ({spread})")
    ratio = medians["DataParallel"] / medians["MirroredStrategy"]
    paired = statistics.median(a / b for a, b in zip(seconds["DataParallel"],
                                                      seconds["MirroredStrategy"]))
    print(f"DataParallel / MirroredStrategy: {ratio:.3f}x of the medians, {paired:.3f}x "
          "the median of each round's ratio (target <= 1.02)")


if __name__ == "__main__":
    main()
