"""Keras 3's gradient accumulation (`gradient_accumulation_steps`) under
MirroredStrategy trains like one device with the same accumulation
(tfdtape.keras3_accumulation): `model.fit`, TensorFlow's tutorial step (the
tape and the apply inside strategy.run) eagerly and in a tf.function, and the
tape around strategy.run; SGD and Adam; 1, 2 and 4 replicas. Compared after
five steps: every copy of every weight, the accumulators and the iteration
counter.

Stock TensorFlow is the control: the traced tutorial step and `fit` fail in
Keras's `cond` ("merge_call called while defining a new graph or a
tf.function", keras-team/keras#20582), the eager tutorial step gives one
device's weights with each replica's copy of the accumulators holding its
own share (not the one device's accumulators), and the tape around
strategy.run raises the handle error.
"""

import re

import numpy as np
import pytest
import tensorflow as tf

from conftest import DEVICES
from keras_models import copies
from keras_models import is_keras3
from tfdtape import testing
from tfdtape.testing import PATCHED_CONFIGURATIONS

pytestmark = [
    pytest.mark.per_release,
    pytest.mark.skipif(not is_keras3(tf.keras), reason="gradient_accumulation_steps is "
                       "Keras 3's (tf.keras before TensorFlow 2.16 is Keras 2)")]

GLOBAL_BATCH = 8
STEPS = 5
ACCUMULATE = 2
RNG = np.random.default_rng(7)
FEATURES = RNG.normal(size=(STEPS * GLOBAL_BATCH, 4)).astype(np.float32)
LABELS = RNG.normal(size=(STEPS * GLOBAL_BATCH, 1)).astype(np.float32)
STYLES = ("fit", "tutorial_traced", "tutorial_eager", "spanning_traced",
          "spanning_eager")
MERGE_CALL_IN_COND = "merge_call` called while defining a new graph"


def build(optimizer_name):
    keras = tf.keras
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"),
                              keras.layers.Dense(1)])
    for index, weight in enumerate(model.weights):
        weight.assign(tf.random.stateless_normal(weight.shape, seed=(3, index)) * 0.5)
    optimizer = (keras.optimizers.Adam(0.01, gradient_accumulation_steps=ACCUMULATE)
                 if optimizer_name == "adam" else
                 keras.optimizers.SGD(0.1, gradient_accumulation_steps=ACCUMULATE))
    if optimizer_name == "loss_scaled_sgd":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=8.0)
    optimizer.build(model.trainable_variables)
    return model, optimizer


def state(model, optimizer):
    """(every copy of every weight, of every accumulator, the iterations)."""
    return ([copies(w) for w in model.trainable_variables],
            [copies(a) for a in getattr(optimizer, "inner_optimizer",
                                        optimizer)._accumulated_gradients],
            int(optimizer.iterations))


def one_device(optimizer_name):
    model, optimizer = build(optimizer_name)
    for step in range(STEPS):
        batch = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
        with tf.GradientTape() as tape:
            loss = optimizer.scale_loss(
                tf.reduce_mean((model(FEATURES[batch]) - LABELS[batch]) ** 2))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables))
    return state(model, optimizer)


def train(strategy, style, optimizer_name):
    with strategy.scope():
        model, optimizer = build(optimizer_name)
    if style == "fit":
        with strategy.scope():
            model.compile(optimizer=optimizer, loss="mse")
        model.fit(FEATURES, LABELS, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False,
                  verbose=0)
        return state(model, optimizer)

    def loss_of(x, y):  # the replica's share of the global batch's mean
        return optimizer.scale_loss(tf.reduce_sum((model(x) - y) ** 2) / GLOBAL_BATCH)

    def tutorial(x, y):
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = loss_of(x, y)
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                          model.trainable_variables))
        strategy.run(replica, args=(x, y))

    def spanning(x, y):
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", strategy.run(loss_of, args=(x, y)), axis=None)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables))

    step = tutorial if style.startswith("tutorial") else spanning
    if style.endswith("traced"):
        step = tf.function(step)
    batches = iter(strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((FEATURES, LABELS)).batch(GLOBAL_BATCH)))
    with strategy.scope():
        for _ in range(STEPS):
            step(*next(batches))
    return state(model, optimizer)


def assert_like_one_device(found, expected):
    weights, accumulators, iterations = found
    for kind, got, wanted in (("weight", weights, expected[0]),
                              ("accumulator", accumulators, expected[1])):
        for index, (components, (reference,)) in enumerate(zip(got, wanted)):
            for component in components:
                np.testing.assert_array_equal(component, components[0],
                                              err_msg=f"{kind} {index}: copies differ")
            np.testing.assert_allclose(components[0], reference, rtol=1e-5, atol=1e-6,
                                       err_msg=f"{kind} {index}")
    assert iterations == expected[2]


@pytest.fixture(scope="module")
def strategy_of_one():
    return tf.distribute.MirroredStrategy(DEVICES[:1])


@pytest.mark.parametrize("optimizer_name", ["sgd", "adam"])
@pytest.mark.parametrize("style", STYLES)
def test_accumulation_under_mirrored_strategy_matches_one_device(
        strategy, configuration, style, optimizer_name):
    expected = one_device(optimizer_name)
    if configuration not in PATCHED_CONFIGURATIONS:
        if style in ("fit", "tutorial_traced"):
            with pytest.raises(RuntimeError, match=MERGE_CALL_IN_COND):
                train(strategy, style, optimizer_name)
            return
        if style.startswith("spanning"):
            with pytest.raises(ValueError, match="handle is not available"):
                train(strategy, style, optimizer_name)
            return
        # The eager tutorial step: each replica accumulates its own share,
        # so the weights are one device's but the accumulators' copies differ.
        weights, accumulators, iterations = train(strategy, style, optimizer_name)
        assert_like_one_device((weights, [], iterations), (expected[0], [], expected[2]))
        assert any(not np.array_equal(components[0], components[1])
                   for components in accumulators)
        return
    assert_like_one_device(train(strategy, style, optimizer_name), expected)


@pytest.mark.parametrize("optimizer_name", ["adam", "loss_scaled_sgd"])
@pytest.mark.parametrize("style", ["fit", "tutorial_traced", "spanning_traced"])
@pytest.mark.parametrize("replicas", [1, 2])
def test_accumulation_with_one_and_two_replicas(strategy_of_one, strategy_of_two,
                                                replicas, style, optimizer_name):
    """Also inside a LossScaleOptimizer (the loss scaled, the update in its
    finite-gradients `cond`)."""
    strategy = strategy_of_one if replicas == 1 else strategy_of_two
    assert_like_one_device(train(strategy, style, optimizer_name),
                           one_device(optimizer_name))


def fit_outcome(strategy, accumulate, steps_per_execution):
    """The weights after `fit` with `steps_per_execution`, or the error's
    type and line that says what failed (numbers of graph nodes masked)."""
    keras = tf.keras
    with strategy.scope():
        model, _ = build("sgd")
        options = {"gradient_accumulation_steps": accumulate} if accumulate else {}
        model.compile(optimizer=keras.optimizers.SGD(0.1, **options), loss="mse",
                      steps_per_execution=steps_per_execution)
    try:
        model.fit(FEATURES, LABELS, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False,
                  verbose=0)
    except Exception as error:  # the test compares what stock raises
        lines = [line.strip() for line in str(error).splitlines() if "placeholder" in line]
        return type(error).__name__, re.sub(r"\d+", "?", (lines or [str(error)])[0])
    return [copies(w) for w in model.trainable_variables]


def test_fit_with_steps_per_execution_under_several_replicas_is_no_worse_than_stock(
        strategy_of_two):
    """Keras 3.15's fit with steps_per_execution=2 under MirroredStrategy(2)
    fails on stock TensorFlow 2.21 ("You must feed a value for placeholder
    tensor '.../while/cond/Placeholder'"), found by the generated training
    programs. With tfdtape, without accumulation, fit gives what stock gives;
    with accumulation (where stock fails earlier, in Keras's cond) it gives
    what fit without accumulation gives on stock, error or weights."""
    with testing.stock():
        stock = fit_outcome(strategy_of_two, 0, 2)
    for configuration in PATCHED_CONFIGURATIONS:
        with testing.configuration(configuration):
            plain = fit_outcome(strategy_of_two, 0, 2)
            accumulated = fit_outcome(strategy_of_two, ACCUMULATE, 2)
        if isinstance(stock, tuple):  # TensorFlow's error
            assert plain == stock and accumulated == stock, configuration
        else:  # a TensorFlow that runs it: tfdtape's weights are stock's
            for ours, theirs in zip(plain, stock):
                np.testing.assert_allclose(ours, theirs, rtol=1e-6)
            assert not isinstance(accumulated, tuple), accumulated
