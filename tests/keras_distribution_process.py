"""Trains small Keras 3 models through `keras.distribution` and prints the
results as one JSON object, for tests/test_keras_distribution.py.

    python tests/keras_distribution_process.py --devices N
        Lays out N virtual CPUs, then runs every scenario of SCENARIOS in
        each configuration it names (tfdtape.testing's: stock, tfdtape,
        tfdtape_alone) through a DataParallel over the N CPUs, and once with
        no distribution (the one-device reference on the global batch).

    python tests/keras_distribution_process.py --job
        One process of a job (TF_CONFIG; with --explicit passed to
        `keras.distribution.initialize()` as its arguments instead),
        DataParallel(), `fit` on a tf.data dataset of global batches,
        `evaluate`, `predict`, and each process's share of a batch through
        `distribute_dataset`; `--job --reference` trains the same on one
        device, alone.

A scenario's result: every copy of every weight with its device, the
losses, the iteration counter, evaluate's loss, predict's output, the
devices a custom step's replicas ran on; an error as its text.
"""

import argparse
import json
import os
import sys
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np

GLOBAL_BATCH = 12
STEPS = 3
RNG = np.random.default_rng(5)
FEATURES = RNG.normal(size=(STEPS * GLOBAL_BATCH, 3)).astype(np.float32)
LABELS = (FEATURES @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 0.25).astype(np.float32)

SCENARIOS = {
    # name: (how the distribution is set, optimizer, accumulation steps,
    #        model, configurations)
    "set_sgd": ("set", "sgd", 0, "sequential", ("tfdtape", "tfdtape_alone", "stock")),
    "scope_adam": ("scope", "adam", 0, "sequential", ("tfdtape",)),
    "set_accumulating_sgd": ("set", "sgd", 2, "sequential", ("tfdtape", "tfdtape_alone")),
    "custom_train_step": ("scope", "sgd", 0, "custom_step", ("tfdtape",)),
    "custom_loop": ("set", "adam", 0, "custom_loop", ("tfdtape", "tfdtape_alone")),
}


def keras_module():
    import keras
    return keras


def model_of(kind):
    keras = keras_module()
    import tensorflow as tf

    if kind == "sequential":
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="tanh"),
                                  keras.layers.Dense(1)])
    else:
        class CustomStep(keras.Model):
            """A model whose train_step is the program's own tape step."""

            def __init__(self):
                super().__init__()
                self.hidden = keras.layers.Dense(2, activation="tanh")
                self.out = keras.layers.Dense(1)
                self.replica_devices = []

            def call(self, x):
                return self.out(self.hidden(x))

            def train_step(self, data):
                x, y = data
                self.replica_devices.append(tf.identity(x).device)
                with tf.GradientTape() as tape:
                    loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
                gradients = tape.gradient(loss, self.trainable_variables)
                self.optimizer.apply(gradients, self.trainable_variables)
                # Not "loss": Keras would log its loss tracker, which this
                # step does not update, instead.
                return {"step_loss": loss}

        model = CustomStep()
        model(np.zeros((1, 3), np.float32))  # builds its layers (in the scope, mirrored)
    for index, weight in enumerate(model.weights):
        weight.assign(tf.random.stateless_normal(weight.shape, seed=(3, index)) * 0.5)
    return model


def optimizer_of(name, accumulate):
    keras = keras_module()
    options = {"gradient_accumulation_steps": accumulate} if accumulate else {}
    return (keras.optimizers.Adam(0.05, **options) if name == "adam"
            else keras.optimizers.SGD(0.1, **options))


def copies(weight):
    """(value, device) of every copy of a Keras weight."""
    import tensorflow as tf
    inner = weight.value
    strategy = getattr(inner, "distribute_strategy", None)
    components = (strategy.experimental_local_results(inner)
                  if isinstance(inner, tf.distribute.DistributedValues) else [inner])
    return [[np.asarray(c.numpy()).tolist(), c.device] for c in components]


def custom_loop(optimizer_name, x, y):
    """TensorFlow's tutorial step (the tape inside `strategy.run`, in a
    tf.function) under whatever strategy the Keras distribution made
    global (none: one device), two epochs."""
    import tensorflow as tf
    strategy = tf.distribute.get_strategy()
    model = model_of("sequential")
    optimizer = optimizer_of(optimizer_name, 0)
    optimizer.build(model.trainable_variables)  # not inside the traced replicas
    batches = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH))

    @tf.function
    def step(features, labels):
        def replica(features, labels):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(
                    tf.square(model(features) - labels)[:, 0], global_batch_size=GLOBAL_BATCH)
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply(gradients, model.trainable_variables)
            return loss
        return strategy.reduce("SUM", strategy.run(replica, args=(features, labels)),
                               axis=None)

    losses = []
    for _ in range(2):
        losses.append(float(np.mean([float(step(*batch)) for batch in batches])))
    predicted = model.predict(x, batch_size=GLOBAL_BATCH, verbose=0)
    return {
        "weights": [copies(w) for w in model.trainable_weights],
        "losses": losses,
        "iterations": int(optimizer.iterations.numpy()),
        "evaluated": losses[-1],
        "predicted": np.asarray(predicted).tolist(),
        "replica_devices": [],
    }


def train(optimizer_name, accumulate, kind, x, y, batch_size=GLOBAL_BATCH):
    if kind == "custom_loop":
        return custom_loop(optimizer_name, x, y)
    model = model_of(kind)
    optimizer = optimizer_of(optimizer_name, accumulate)
    model.compile(optimizer=optimizer, loss="mse")
    history = model.fit(x, y, batch_size=batch_size, epochs=2, shuffle=False, verbose=0)
    evaluated = model.evaluate(x, y, batch_size=batch_size, verbose=0)
    predicted = model.predict(x, batch_size=batch_size, verbose=0)
    return {
        "weights": [copies(w) for w in model.trainable_weights],
        "losses": [float(v) for v in history.history[
            "step_loss" if kind == "custom_step" else "loss"]],
        "iterations": int(optimizer.iterations.numpy()),
        "evaluated": float(evaluated),
        "predicted": np.asarray(predicted).tolist(),
        "replica_devices": sorted(set(getattr(model, "replica_devices", []))),
    }


def guarded(run):
    try:
        return run()
    except Exception as error:  # the tests read the refusals
        return {"error": f"{type(error).__name__}: {error}",
                "traceback": traceback.format_exc()[-2000:]}


def run_scenario(name, devices):
    keras = keras_module()
    how, optimizer_name, accumulate, kind, _ = SCENARIOS[name]
    distribution = keras.distribution.DataParallel(devices=devices)
    if how == "set":
        keras.distribution.set_distribution(distribution)
        try:
            return guarded(lambda: train(optimizer_name, accumulate, kind, FEATURES, LABELS))
        finally:
            keras.distribution.set_distribution(None)
    with distribution.scope():
        return guarded(lambda: train(optimizer_name, accumulate, kind, FEATURES, LABELS))


def built_before():
    """A model built before the distribution is set, then fit under it."""
    keras = keras_module()
    model = model_of("sequential")
    model.compile(optimizer=optimizer_of("sgd", 0), loss="mse")
    keras.distribution.set_distribution(
        keras.distribution.DataParallel(devices=keras.distribution.list_devices()))

    def fit():
        model.fit(FEATURES, LABELS, batch_size=GLOBAL_BATCH, verbose=0)
        return {}

    try:
        return guarded(fit)
    finally:
        keras.distribution.set_distribution(None)


def devices_main(count):
    from tfdtape import testing
    testing.virtual_cpus(count)
    import tensorflow as tf
    keras = keras_module()
    devices = keras.distribution.list_devices()
    results = {"devices": devices, "reference": {}, "scenarios": {}}
    for name, (_, optimizer_name, accumulate, kind, configurations) in SCENARIOS.items():
        results["reference"][name] = train(optimizer_name, accumulate, kind, FEATURES,
                                           LABELS)
        for configuration in configurations:
            with testing.configuration(configuration):
                results["scenarios"][f"{name}/{configuration}"] = run_scenario(name, devices)
    with testing.configuration("tfdtape"):
        results["built_before"] = built_before()
        results["strategy_after"] = type(tf.distribute.get_strategy()).__name__
    return results


def job_main(reference, explicit, accumulate):
    import tensorflow as tf

    import tfdtape  # noqa: F401 (installs)
    keras = keras_module()
    if reference:
        processes = int(os.environ["JOB_PROCESSES"])
        dataset = tf.data.Dataset.from_tensor_slices((FEATURES, LABELS)).batch(GLOBAL_BATCH)
        result = train("adam", accumulate, "sequential", dataset, None, batch_size=None)
        return dict(result, processes=processes)
    if explicit:  # the job as initialize()'s arguments, not TF_CONFIG
        tf_config = json.loads(os.environ.pop("TF_CONFIG"))
        keras.distribution.initialize(",".join(tf_config["cluster"]["worker"]),
                                      len(tf_config["cluster"]["worker"]),
                                      tf_config["task"]["index"])
    else:
        keras.distribution.initialize()
    distribution = keras.distribution.DataParallel()
    keras.distribution.set_distribution(distribution)
    dataset = tf.data.Dataset.from_tensor_slices((FEATURES, LABELS)).batch(GLOBAL_BATCH)
    first_share = None
    if hasattr(distribution, "distribute_dataset"):  # Keras 3.15, not keras-nightly 3.16
        first_share = np.asarray(next(iter(distribution.distribute_dataset(
            tf.data.Dataset.from_tensor_slices(FEATURES).batch(GLOBAL_BATCH))))).tolist()
    result = train("adam", accumulate, "sequential", dataset, None, batch_size=None)
    return dict(result, processes=distribution.num_processes,
                process_id=distribution._process_id, first_share=first_share,
                keras=keras.__version__)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int)
    parser.add_argument("--job", action="store_true")
    parser.add_argument("--reference", action="store_true")
    parser.add_argument("--explicit", action="store_true")
    parser.add_argument("--accumulate", type=int, default=0)
    arguments = parser.parse_args()
    if arguments.job:
        result = guarded(lambda: job_main(arguments.reference, arguments.explicit,
                                            arguments.accumulate))
    else:
        result = devices_main(arguments.devices)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
