"""A custom training loop under MirroredStrategy(4) trains identically with tfdtape."""

import numpy as np
import pytest
import tensorflow as tf

from tfdtape import testing

pytestmark = pytest.mark.per_release

FEATURES = np.arange(16, dtype=np.float32).reshape(8, 2) / 8.0
TARGETS = FEATURES @ np.array([[2.0], [-1.0]], np.float32) + 0.5
LEARNING_RATE = 0.1
STEPS = 3


def train(strategy, configuration, traced):
    """Trains a linear model for STEPS steps; returns (kernel, bias) as numpy."""
    with testing.configuration(configuration):
        with strategy.scope():
            kernel = tf.Variable([[0.5], [-0.5]])
            bias = tf.Variable([0.0])
            optimizer = tf.keras.optimizers.SGD(LEARNING_RATE)
        shards = strategy.experimental_distribute_values_from_function(
            lambda context: (
                FEATURES[2 * context.replica_id_in_sync_group:][:2],
                TARGETS[2 * context.replica_id_in_sync_group:][:2]))

        def replica_step(features, targets):
            with tf.GradientTape() as tape:
                error = features @ kernel + bias - targets
                loss = tf.reduce_sum(error * error) / len(FEATURES)
            gradients = tape.gradient(loss, [kernel, bias])
            optimizer.apply_gradients(zip(gradients, [kernel, bias]))

        def step():
            strategy.run(replica_step, args=shards)

        if traced:
            step = tf.function(step, autograph=False)
        for _ in range(STEPS):
            step()
        return kernel.numpy(), bias.numpy()


def reference_weights():
    """The same training computed in NumPy, on the whole batch."""
    kernel = np.array([[0.5], [-0.5]], np.float32)
    bias = np.array([0.0], np.float32)
    for _ in range(STEPS):
        error = FEATURES @ kernel + bias - TARGETS
        kernel = kernel - LEARNING_RATE * 2 * FEATURES.T @ error / len(FEATURES)
        bias = bias - LEARNING_RATE * 2 * error.sum(axis=0) / len(FEATURES)
    return kernel, bias


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf.function"])
def test_training_matches_stock_tensorflow(strategy, traced):
    results = {name: train(strategy, name, traced)
               for name in testing.CONFIGURATIONS}
    stock_kernel, stock_bias = results["stock"]
    for name in testing.PATCHED_CONFIGURATIONS:
        kernel, bias = results[name]
        np.testing.assert_array_equal(kernel, stock_kernel)
        np.testing.assert_array_equal(bias, stock_bias)
    expected_kernel, expected_bias = reference_weights()
    np.testing.assert_allclose(stock_kernel, expected_kernel, rtol=1e-5)
    np.testing.assert_allclose(stock_bias, expected_bias, rtol=1e-5)
    assert not np.allclose(stock_kernel, [[0.5], [-0.5]])
