"""Keras 2's LossScaleOptimizer (tf_keras; tf.keras before TensorFlow 2.16)
applying in cross-replica context (tfdtape.keras2_loss_scaling): the total
of a tape around strategy.run, the loss scale updated once per step, the
inner optimizer applying once, overflow steps skipped; against the same
optimizer on one device over the global batch, eagerly and in a
tf.function, around a Keras 2 optimizer and a legacy one.

Stock TensorFlow cannot run the loop (the handle error at tape.gradient);
with tfdtape but Keras's own `apply_gradients`, the apply refuses
cross-replica context.
"""

import numpy as np
import pytest
import tensorflow as tf

from keras_models import is_keras3
from keras_models import keras_module
from tfdtape import keras2_loss_scaling
from tfdtape import targets
from tfdtape.testing import PATCHED_CONFIGURATIONS

pytestmark = pytest.mark.per_release

KERAS = "tf_keras" if is_keras3(tf.keras) else "tf.keras"
FEATURES = np.linspace(-1.0, 1.0, 24, dtype=np.float32).reshape(8, 3)
LABELS = np.linspace(0.5, -0.5, 8, dtype=np.float32).reshape(8, 1)
STEPS = 5
OVERFLOWS = (1,)
"""The steps whose loss is infinite: skipped, the scale halved."""
INNER = ("optimizer", "legacy")
"""A Keras 2 optimizer (LossScaleOptimizerV3) or a legacy one (the legacy
LossScaleOptimizer)."""


def build(inner):
    keras = keras_module(KERAS)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2),
                              keras.layers.Dense(1)])
    for weight in model.weights:
        weight.assign(tf.random.stateless_normal(weight.shape, seed=(1, 2)) * 0.5)
    sgd = keras.optimizers.legacy.SGD if inner == "legacy" else keras.optimizers.SGD
    optimizer = keras.mixed_precision.LossScaleOptimizer(
        sgd(0.1), initial_scale=8.0, dynamic_growth_steps=2)
    return model, optimizer


def state(model, optimizer):
    return ([w.numpy() for w in model.weights], float(optimizer.loss_scale.numpy()),
            int(optimizer.iterations.numpy()))


def one_device(inner):
    model, optimizer = build(inner)
    for step in range(STEPS):
        with tf.GradientTape() as tape:
            error = model(FEATURES) - LABELS
            loss = tf.reduce_mean(error * error) * (np.inf if step in OVERFLOWS else 1.0)
            scaled = optimizer.get_scaled_loss(loss)
        gradients = optimizer.get_unscaled_gradients(
            tape.gradient(scaled, model.trainable_variables))
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    return state(model, optimizer)


def spanning_steps(strategy, inner, mode):
    """The loop with the tape around strategy.run and the apply in
    cross-replica context; returns the final state."""
    with strategy.scope():
        model, optimizer = build(inner)
    dataset = tf.data.Dataset.from_tensor_slices((FEATURES, LABELS)).batch(8)
    x, y = next(iter(strategy.experimental_distribute_dataset(dataset)))

    def share(x, y, factor):
        error = model(x) - y
        return tf.nn.compute_average_loss(tf.reduce_sum(error * error, axis=1),
                                          global_batch_size=8) * factor

    def step(factor):
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", strategy.run(share, args=(x, y, factor)),
                                   axis=None)
            scaled = optimizer.get_scaled_loss(loss)
        gradients = optimizer.get_unscaled_gradients(
            tape.gradient(scaled, model.trainable_variables))
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))

    if mode == "tf_function":
        step = tf.function(step)
    with strategy.scope():
        for i in range(STEPS):
            step(tf.constant(np.inf if i in OVERFLOWS else 1.0))
    return state(model, optimizer)


@pytest.mark.parametrize("mode", ["eager", "tf_function"])
@pytest.mark.parametrize("inner", INNER)
def test_the_cross_replica_apply_matches_one_device(strategy, configuration, inner, mode):
    if configuration not in PATCHED_CONFIGURATIONS:
        keras_module(KERAS)  # skips without tf_keras
        with pytest.raises(ValueError, match="handle is not available"):
            spanning_steps(strategy, inner, mode)
        return
    weights, scale, applied = spanning_steps(strategy, inner, mode)
    expected_weights, expected_scale, expected_applied = one_device(inner)
    # 5 steps: 8 halved to 4 by the overflow of step 1, doubled back to 8
    # after steps 2 and 3; the iterations count every step, skipped or not.
    assert (scale, applied) == (8.0, 5)
    assert (scale, applied) == (expected_scale, expected_applied)
    for found, expected in zip(weights, expected_weights):
        np.testing.assert_allclose(found, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("inner", INNER)
def test_without_tfdtapes_apply_keras_refuses_cross_replica_context(
        strategy, monkeypatch, inner):
    """The control: tfdtape installed (stock fails before the apply), with
    Keras's own `apply_gradients`."""
    keras_module(KERAS)  # skips without tf_keras
    for cls, _ in keras2_loss_scaling.keras2_classes():
        current = vars(cls)[keras2_loss_scaling.ATTRIBUTE]
        monkeypatch.setattr(cls, keras2_loss_scaling.ATTRIBUTE,
                            targets.original_of(current))
    with pytest.raises(ValueError, match="apply_gradients\\(\\) must be called "
                       "in a replica context"):
        spanning_steps(strategy, inner, "eager")


def test_both_classes_are_patched_where_keras_2_is_loaded():
    keras_module(KERAS)  # skips without tf_keras
    found = {cls.__name__: vars(cls)[keras2_loss_scaling.ATTRIBUTE]
             for cls, _ in keras2_loss_scaling.keras2_classes()}
    assert sorted(found) == ["LossScaleOptimizer", "LossScaleOptimizerV3"]
    for function in found.values():
        assert targets.original_of(function) is not None


@pytest.mark.parametrize("inner", INNER)
def test_per_replica_gradients_are_refused_before_any_variable_changes(
        strategy, configuration, inner):
    if configuration not in PATCHED_CONFIGURATIONS:
        return
    with strategy.scope():
        model, optimizer = build(inner)
        optimizer.apply_gradients(zip([tf.zeros_like(v) for v in model.trainable_variables],
                                      model.trainable_variables))
        per_replica = strategy.run(lambda: [tf.ones_like(v) for v in model.trainable_variables])
        before = state(model, optimizer)
        with pytest.raises(ValueError, match="cannot apply per-replica values") as raised:
            optimizer.apply_gradients(zip(per_replica, model.trainable_variables))
    assert keras2_loss_scaling._SYMBOL in str(raised.value)
    after = state(model, optimizer)
    assert after[1:] == before[1:]
    for found, expected in zip(after[0], before[0]):
        np.testing.assert_array_equal(found, expected)


@pytest.mark.parametrize("inner", INNER)
def test_the_tutorial_loop_with_loss_scaling_is_unchanged(strategy, configuration, inner):
    """Tape and apply inside strategy.run (Keras's own path): one device's
    state, in every configuration."""
    with strategy.scope():
        model, optimizer = build(inner)
    dataset = tf.data.Dataset.from_tensor_slices((FEATURES, LABELS)).batch(8)
    x, y = next(iter(strategy.experimental_distribute_dataset(dataset)))

    def replica_step(x, y, factor):
        with tf.GradientTape() as tape:
            error = model(x) - y
            loss = tf.nn.compute_average_loss(tf.reduce_sum(error * error, axis=1),
                                              global_batch_size=8) * factor
            scaled = optimizer.get_scaled_loss(loss)
        gradients = optimizer.get_unscaled_gradients(
            tape.gradient(scaled, model.trainable_variables))
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))

    @tf.function
    def step(factor):
        strategy.run(replica_step, args=(x, y, factor))

    for i in range(STEPS):
        step(tf.constant(np.inf if i in OVERFLOWS else 1.0))
    weights, scale, applied = state(model, optimizer)
    expected_weights, expected_scale, expected_applied = one_device(inner)
    assert (scale, applied) == (expected_scale, expected_applied)
    for found, expected in zip(weights, expected_weights):
        np.testing.assert_allclose(found, expected, rtol=1e-5, atol=1e-6)
