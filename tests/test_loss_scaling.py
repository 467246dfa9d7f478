"""Keras 3's LossScaleOptimizer applying in cross-replica context
(tfdtape.keras3_loss_scaling): the total of a tape around strategy.run, one finite
check, the scale updated once per step, the inner optimizer applying once,
overflow steps skipped; against the same optimizer on one device over the
global batch, eagerly and in a tf.function.

Stock TensorFlow cannot run the loop (the handle error at tape.gradient);
with tfdtape but Keras's own `_tf_apply`, the apply refuses cross-replica
context.
"""

import numpy as np
import pytest
import tensorflow as tf

from keras_models import is_keras3
from tfdtape import keras3_loss_scaling
from tfdtape import targets
from tfdtape.testing import PATCHED_CONFIGURATIONS

pytestmark = [
    pytest.mark.per_release,
    pytest.mark.skipif(not is_keras3(tf.keras), reason="Keras 3's LossScaleOptimizer "
                       "(Keras 2's tf.keras before TensorFlow 2.16 has its own)")]

FEATURES = np.linspace(-1.0, 1.0, 24, dtype=np.float32).reshape(8, 3)
LABELS = np.linspace(0.5, -0.5, 8, dtype=np.float32).reshape(8, 1)
STEPS = 5
OVERFLOWS = (1,)
"""The steps whose loss is infinite: skipped, the scale halved."""


def build():
    keras = tf.keras
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2),
                              keras.layers.Dense(1)])
    for weight in model.weights:
        weight.assign(tf.random.stateless_normal(weight.shape, seed=(1, 2)) * 0.5)
    optimizer = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.1), initial_scale=8.0, dynamic_growth_steps=2)
    optimizer.build(model.trainable_variables)
    return model, optimizer


def state(model, optimizer):
    return ([w.numpy() for w in model.weights], float(optimizer.dynamic_scale.numpy()),
            int(optimizer.step_counter.numpy()),
            int(optimizer.inner_optimizer.iterations.numpy()))


def one_device():
    model, optimizer = build()
    for step in range(STEPS):
        with tf.GradientTape() as tape:
            error = model(FEATURES) - LABELS
            loss = tf.reduce_mean(error * error) * (np.inf if step in OVERFLOWS else 1.0)
            scaled = optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply(gradients, model.trainable_variables)
    return state(model, optimizer)


def spanning_steps(strategy, mode):
    """The loop with the tape around strategy.run and the apply in
    cross-replica context; returns the final state."""
    with strategy.scope():
        model, optimizer = build()
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
            scaled = optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply(gradients, model.trainable_variables)

    if mode == "tf_function":
        step = tf.function(step)
    with strategy.scope():
        for i in range(STEPS):
            step(tf.constant(np.inf if i in OVERFLOWS else 1.0))
    return state(model, optimizer)


@pytest.mark.parametrize("mode", ["eager", "tf_function"])
def test_the_cross_replica_apply_matches_one_device(strategy, configuration, mode):
    if configuration not in PATCHED_CONFIGURATIONS:
        with pytest.raises(ValueError, match="handle is not available"):
            spanning_steps(strategy, mode)
        return
    weights, scale, counter, applied = spanning_steps(strategy, mode)
    expected_weights, expected_scale, expected_counter, expected_applied = one_device()
    # 5 steps: 8 halved to 4 by the overflow of step 1, doubled back to 8
    # after steps 2 and 3, step 4 counted; 4 steps applied.
    assert (scale, counter, applied) == (8.0, 1, 4)
    assert (scale, counter, applied) == (expected_scale, expected_counter, expected_applied)
    for found, expected in zip(weights, expected_weights):
        np.testing.assert_allclose(found, expected, rtol=1e-5, atol=1e-6)


def test_without_tfdtapes_apply_keras_refuses_cross_replica_context(
        strategy, monkeypatch):
    """The control: tfdtape installed (stock fails before the apply), with
    Keras's own `_tf_apply`."""
    keras_class = keras3_loss_scaling.keras_class()
    current = vars(keras_class)[keras3_loss_scaling.ATTRIBUTE]
    monkeypatch.setattr(keras_class, keras3_loss_scaling.ATTRIBUTE, targets.original_of(current))
    with pytest.raises(ValueError, match="apply\\(\\) must be called in a replica context"):
        spanning_steps(strategy, "eager")


def test_per_replica_gradients_are_refused_before_any_variable_changes(
        strategy, configuration):
    if configuration not in PATCHED_CONFIGURATIONS:
        return
    with strategy.scope():
        model, optimizer = build()
        per_replica = strategy.run(lambda: [tf.ones_like(v) for v in model.trainable_variables])
        before = state(model, optimizer)
        with pytest.raises(ValueError, match="cannot apply per-replica values") as raised:
            optimizer.apply(per_replica, model.trainable_variables)
    assert keras3_loss_scaling._SYMBOL in str(raised.value)
    after = state(model, optimizer)
    assert after[1:] == before[1:]
    for found, expected in zip(after[0], before[0]):
        np.testing.assert_array_equal(found, expected)


def test_the_tutorial_loop_with_loss_scaling_is_unchanged(strategy, configuration):
    """Tape and apply inside strategy.run (Keras's own path): one device's
    state, in every configuration."""
    with strategy.scope():
        model, optimizer = build()
    dataset = tf.data.Dataset.from_tensor_slices((FEATURES, LABELS)).batch(8)
    x, y = next(iter(strategy.experimental_distribute_dataset(dataset)))

    def replica_step(x, y, factor):
        with tf.GradientTape() as tape:
            error = model(x) - y
            loss = tf.nn.compute_average_loss(tf.reduce_sum(error * error, axis=1),
                                              global_batch_size=8) * factor
            scaled = optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply(gradients, model.trainable_variables)

    @tf.function
    def step(factor):
        strategy.run(replica_step, args=(x, y, factor))

    for i in range(STEPS):
        step(tf.constant(np.inf if i in OVERFLOWS else 1.0))
    weights, scale, counter, applied = state(model, optimizer)
    expected_weights, expected_scale, expected_counter, expected_applied = one_device()
    assert (scale, counter, applied) == (expected_scale, expected_counter, expected_applied)
    for found, expected in zip(weights, expected_weights):
        np.testing.assert_allclose(found, expected, rtol=1e-5, atol=1e-6)


def test_an_overflow_on_one_replica_only_skips_the_step_on_every_replica(
        strategy, configuration):
    """The tutorial loop whose loss is infinite on the last replica only, at
    the steps of OVERFLOWS: Keras takes the first replica's finite check
    (its own gradients, not all-reduced) and applies the step, inf and all
    (stock, the control); tfdtape's check_finite all-reduces every
    replica's answer, so the step is skipped and the scale halved, as on one
    device."""
    with strategy.scope():
        model, optimizer = build()
    dataset = tf.data.Dataset.from_tensor_slices((FEATURES, LABELS)).batch(8)
    x, y = next(iter(strategy.experimental_distribute_dataset(dataset)))
    last = strategy.num_replicas_in_sync - 1

    def replica_step(x, y, factor):
        context = tf.distribute.get_replica_context()
        factor = tf.where(tf.equal(context.replica_id_in_sync_group, last), factor, 1.0)
        with tf.GradientTape() as tape:
            error = model(x) - y
            loss = tf.nn.compute_average_loss(tf.reduce_sum(error * error, axis=1),
                                              global_batch_size=8) * factor
            scaled = optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply(gradients, model.trainable_variables)

    @tf.function
    def step(factor):
        strategy.run(replica_step, args=(x, y, factor))

    for i in range(STEPS):
        step(tf.constant(np.inf if i in OVERFLOWS else 1.0))
    weights, scale, counter, applied = state(model, optimizer)
    if configuration not in PATCHED_CONFIGURATIONS:
        assert not all(np.isfinite(w).all() for w in weights)
        return
    expected_weights, expected_scale, expected_counter, expected_applied = one_device()
    assert (scale, counter, applied) == (expected_scale, expected_counter, expected_applied)
    for found, expected in zip(weights, expected_weights):
        np.testing.assert_allclose(found, expected, rtol=1e-5, atol=1e-6)
