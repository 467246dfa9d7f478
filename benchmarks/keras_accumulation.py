"""What Keras 3's gradient accumulation costs in `model.fit` under
MirroredStrategy(2) with tfdtape, against what it costs on one device.

Five configurations: one device (no strategy) and MirroredStrategy over 2
virtual CPUs, each with `gradient_accumulation_steps=2` and without, with
tfdtape; and MirroredStrategy(2) without accumulation on stock TensorFlow.
One fresh process per sample, the configurations alternating (their order
rotates every round); each process trains an 8-layer Dense(64) model with
SGD for one epoch to trace and warm up, then times a second epoch of
`--steps` steps. Reported: the median seconds per step of each
configuration; per strategy, accumulation / none (target: no more under
MirroredStrategy(2) than on one device); and tfdtape / stock without
accumulation. On stock TensorFlow `fit` with accumulation fails under
MirroredStrategy (keras-team/keras#20582): no stock accumulation column.

Usage: python benchmarks/keras_accumulation.py [--samples 6] [--steps 60]
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

CONFIGURATIONS = (("one device", "none", 0), ("one device", "none", 2),
                  ("MirroredStrategy(2)", "mirrored", 0),
                  ("MirroredStrategy(2)", "mirrored", 2),
                  ("MirroredStrategy(2) stock", "mirrored", 0))
GLOBAL_BATCH = 64
WIDTH = 64
LAYERS = 8


def sample(strategy_name, accumulate, steps):
    """Seconds per step of the timed epoch, in this (fresh) process; stock
    TensorFlow where TFDTAPE_AUTOINSTALL=0."""
    import numpy as np
    import tensorflow as tf

    import tfdtape
    from tfdtape import testing

    if tfdtape.is_installed() != (os.environ.get("TFDTAPE_AUTOINSTALL") != "0"):
        raise RuntimeError("tfdtape is not in the state this sample asks for")

    strategy = (testing.mirrored_strategy(2) if strategy_name == "mirrored"
                else tf.distribute.get_strategy())
    keras = tf.keras
    with strategy.scope():
        model = keras.Sequential([keras.Input((WIDTH,))] + [
            keras.layers.Dense(WIDTH, activation="tanh") for _ in range(LAYERS)] + [
            keras.layers.Dense(1)])
        options = {"gradient_accumulation_steps": accumulate} if accumulate else {}
        model.compile(keras.optimizers.SGD(0.01, **options), loss="mse")
    rng = np.random.default_rng(0)
    features = rng.normal(size=(steps * GLOBAL_BATCH, WIDTH)).astype(np.float32)
    labels = rng.normal(size=(steps * GLOBAL_BATCH, 1)).astype(np.float32)
    model.fit(features, labels, batch_size=GLOBAL_BATCH, epochs=1, verbose=0)
    start = time.perf_counter()
    model.fit(features, labels, batch_size=GLOBAL_BATCH, epochs=1, verbose=0)
    return (time.perf_counter() - start) / steps


def run_sample(label, strategy_name, accumulate, steps):
    completed = subprocess.run(
        [sys.executable, __file__, "--sample", strategy_name, str(accumulate),
         "--steps", str(steps)], capture_output=True, text=True, check=False,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
                 TFDTAPE_AUTOINSTALL="0" if label.endswith("stock") else "1"))
    if completed.returncode != 0:
        raise RuntimeError(f"{strategy_name} {accumulate} failed:\n{completed.stderr[-2000:]}")
    return float(completed.stdout.split()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=6)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--sample", nargs=2, metavar=("STRATEGY", "ACCUMULATE"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sample:
        print(sample(args.sample[0], int(args.sample[1]), args.steps))
        return
    seconds = {configuration: [] for configuration in CONFIGURATIONS}
    for index in range(args.samples):
        shift = index % len(CONFIGURATIONS)
        for configuration in CONFIGURATIONS[shift:] + CONFIGURATIONS[:shift]:
            seconds[configuration].append(run_sample(*configuration, args.steps))
    medians = {configuration: statistics.median(found)
               for configuration, found in seconds.items()}
    print(f"model.fit, {LAYERS} Dense({WIDTH}) layers, global batch {GLOBAL_BATCH}, "
          f"SGD; median ms per step of {args.samples} fresh processes each")
    ratios = {}
    for label in ("one device", "MirroredStrategy(2)"):
        plain, accumulated = (medians[c] for c in CONFIGURATIONS if c[0] == label)
        ratios[label] = accumulated / plain
        print(f"{label:>20}: no accumulation {plain * 1e3:.2f}  accumulation 2 "
              f"{accumulated * 1e3:.2f}  ratio {ratios[label]:.3f}x")
    mirrored, alone = ratios["MirroredStrategy(2)"], ratios["one device"]
    print(f"accumulation's ratio under MirroredStrategy(2) / on one device: "
          f"{mirrored / alone:.3f} (target <= 1.0)")
    stock = medians[CONFIGURATIONS[4]]
    print(f"MirroredStrategy(2), no accumulation: tfdtape {medians[CONFIGURATIONS[2]] * 1e3:.2f}"
          f"  stock {stock * 1e3:.2f}  ratio {medians[CONFIGURATIONS[2]] / stock:.3f}x")


if __name__ == "__main__":
    main()
