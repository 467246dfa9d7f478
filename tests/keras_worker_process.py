"""Trains a small Keras model with `fit`, then `evaluate`s and `predict`s,
and prints the result as JSON (every copy of every weight, the accumulators,
the iteration counter, History's losses, evaluate's loss, predict's output).

With TF_CONFIG set: one worker of a MultiWorkerMirroredStrategy cluster.
Without: the one-device reference (no strategy), on the global batch.
Arguments: one or more cases OPTIMIZER:ACCUMULATE:CONFIGURATION (sgd or
adam; 0: no accumulation; one of tfdtape.testing's configurations: stock,
tfdtape, tfdtape_alone), trained one after the other under one strategy;
the JSON printed is the list of their results. An error is printed as the
case's result, for the stock controls. Run by
tests/test_keras_multi_worker.py, one process per worker for all the cases
of a cluster. Uses `tf.keras`, so `TF_USE_LEGACY_KERAS=1` trains with
tf_keras.
"""

import json
import os
import sys
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf

from keras_models import copies
from tfdtape import testing

GLOBAL_BATCH = 12
STEPS = 3
RNG = np.random.default_rng(11)
FEATURES = RNG.normal(size=(STEPS * GLOBAL_BATCH, 4)).astype(np.float32)
LABELS = RNG.normal(size=(STEPS * GLOBAL_BATCH, 1)).astype(np.float32)


def build(optimizer_name, accumulate):
    keras = tf.keras
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"),
                              keras.layers.Dense(1)])
    for index, weight in enumerate(model.weights):
        weight.assign(tf.random.stateless_normal(weight.shape, seed=(5, index)) * 0.5)
    options = {"gradient_accumulation_steps": accumulate} if accumulate else {}
    optimizer = (keras.optimizers.Adam(0.01, **options) if optimizer_name == "adam"
                 else keras.optimizers.SGD(0.1, **options))
    model.compile(optimizer=optimizer, loss="mse")
    return model, optimizer


def as_lists(variable):
    """Every component's value of a (Keras) variable, as lists."""
    return [copy.tolist() for copy in copies(variable)]


def accumulators(optimizer):
    """Keras 3's gradient accumulators (none for tf_keras)."""
    found = getattr(optimizer, "_accumulated_gradients", None)
    return found if isinstance(found, list) else []


def train(optimizer_name, accumulate):
    model, optimizer = build(optimizer_name, accumulate)
    history = model.fit(FEATURES, LABELS, batch_size=GLOBAL_BATCH, epochs=3,
                        shuffle=False, verbose=0)
    evaluated = model.evaluate(FEATURES, LABELS, batch_size=GLOBAL_BATCH, verbose=0)
    predicted = model.predict(FEATURES, batch_size=GLOBAL_BATCH, verbose=0)
    return {
        "weights": [as_lists(w) for w in model.trainable_variables],
        "accumulators": [as_lists(a) for a in accumulators(optimizer)],
        "iterations": int(optimizer.iterations.numpy()),
        "losses": [float(x) for x in history.history["loss"]],
        "evaluated": float(evaluated),
        "predicted": np.asarray(predicted).tolist(),
    }


def main():
    task, strategy = None, tf.distribute.get_strategy()
    if "TF_CONFIG" in os.environ:
        task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    results = []
    for case in sys.argv[1:]:
        optimizer_name, accumulate, configuration = case.split(":")
        with testing.configuration(configuration):
            results.append(dict(task=task, **run(strategy, optimizer_name, int(accumulate))))
    print(json.dumps(results))
    return 0


def run(strategy, optimizer_name, accumulate):
    """The result of training under `strategy`, or the error."""
    result = {}
    try:
        with strategy.scope():
            result.update(train(optimizer_name, accumulate))
    except Exception as error:  # the test reads what stock raises
        result["error"] = f"{type(error).__name__}: {error}"
        result["traceback"] = traceback.format_exc()[-2000:]
    return result


if __name__ == "__main__":
    sys.exit(main())
