"""Keras under MirroredStrategy(4): same training with tfdtape, model variables watched.

Runs with `tf.keras` (Keras 3 from TensorFlow 2.16, Keras 2 before) and with
`tf_keras` (Keras 2 for TensorFlow 2.16+, installed with
`pip install --no-deps tf_keras`); before 2.16 `tf.keras` is Keras 2 and
there is no separate tf_keras case.
"""

import numpy as np
import pytest
import tensorflow as tf

from keras_models import KERAS_MODULES
from keras_models import keras_module
from keras_models import tf_variable
from tfdtape import testing

pytestmark = pytest.mark.per_release

FEATURES = (np.arange(32, dtype=np.float32).reshape(16, 2) % 7) / 7.0
TARGETS = FEATURES @ np.array([[1.5], [-2.0]], np.float32) + 0.25
KERNELS = [np.array([[0.2, -0.1, 0.3], [0.4, 0.1, -0.2]], np.float32),
           np.zeros(3, np.float32),
           np.array([[0.5], [-0.3], [0.2]], np.float32),
           np.zeros(1, np.float32)]


@pytest.fixture(params=KERAS_MODULES)
def keras(request):
    return keras_module(request.param)


def build_model(keras):
    model = keras.Sequential([
        keras.Input((2,)),
        keras.layers.Dense(3, activation="tanh"),
        keras.layers.Dense(1),
    ])
    model.set_weights(KERNELS)
    return model


def fit_weights(keras, strategy, configuration):
    with testing.configuration(configuration):
        with strategy.scope():
            model = build_model(keras)
            model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        model.fit(FEATURES, TARGETS, batch_size=8, epochs=3, shuffle=False,
                  verbose=0)
        return model.get_weights()


def test_fit_trains_as_stock_tensorflow(keras, strategy):
    stock = fit_weights(keras, strategy, "stock")
    assert not np.allclose(stock[0], KERNELS[0])  # it trained
    for configuration in testing.PATCHED_CONFIGURATIONS:
        for found, expected in zip(fit_weights(keras, strategy, configuration),
                                   stock):
            np.testing.assert_array_equal(found, expected)


def custom_loop(keras, strategy, configuration, steps=3):
    """Trains with a tape in strategy.run; returns (weights, watched per step)."""
    with testing.configuration(configuration):
        with strategy.scope():
            model = build_model(keras)
            optimizer = keras.optimizers.SGD(0.1)
        shards = strategy.experimental_distribute_values_from_function(
            lambda context: (
                FEATURES[4 * context.replica_id_in_sync_group:][:4],
                TARGETS[4 * context.replica_id_in_sync_group:][:4]))
        watched = []

        def replica_step(features, targets):
            with tf.GradientTape() as tape:
                error = model(features) - targets
                loss = tf.reduce_sum(error * error) / len(FEATURES)
            watched.append(tape.watched_variables())
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))

        for _ in range(steps):
            strategy.run(replica_step, args=shards)
        return model, watched


def test_custom_loop_watches_the_models_variables(keras, strategy, configuration):
    model, watched = custom_loop(keras, strategy, configuration)
    expected = {id(tf_variable(v)) for v in model.trainable_variables}
    assert len(expected) == 4 and len(watched) == 12
    for found in watched:
        found_ids = {id(v) for v in found}
        if configuration == "pre_seed":
            assert found_ids.isdisjoint(expected)  # the replica's components
            assert len(found_ids) == 4
        else:
            assert found_ids == expected


def test_custom_loop_trains_as_stock_tensorflow(keras, strategy):
    stock = custom_loop(keras, strategy, "stock")[0].get_weights()
    assert not np.allclose(stock[0], KERNELS[0])
    for configuration in testing.PATCHED_CONFIGURATIONS:
        found = custom_loop(keras, strategy, configuration)[0].get_weights()
        for found_weight, stock_weight in zip(found, stock):
            np.testing.assert_array_equal(found_weight, stock_weight)
