"""Keras variables and Keras train steps in cross-replica context.

The program behind many "DistributedVariable.handle is not available outside
the replica context" reports: a Keras model's train step called under
`strategy.scope()` without `strategy.run`. Stock TensorFlow and the pre-seed
control raise at `tape.gradient`; with tfdtape the gradients equal the
single-device model's, and applying them with `assign_sub` trains exactly as
on one device (applying with a Keras optimizer there:
tests/test_spanning_training.py). Keras 3 variables (`tf.keras` from 2.16) are first-class
wherever tfdtape takes a tf.Variable; Keras 2 (`tf_keras`, `tf.keras` before
2.16) creates tf.Variables, so its cases check the same programs on them.
"""

import numpy as np
import pytest
import tensorflow as tf

import tfdtape
from assertions import assert_same_objects
from conftest import DEVICES
from keras_models import KERAS_MODULES
from keras_models import LABELS
from keras_models import TOKENS
from keras_models import embedding_model
from keras_models import is_keras3
from keras_models import keras_module
from keras_models import mean_squared_error
from keras_models import tf_variable
from tfdtape import resolution
from tfdtape.testing import PATCHED_CONFIGURATIONS

pytestmark = pytest.mark.per_release

HANDLE_UNAVAILABLE = ("DistributedVariable.handle is not available outside "
                      "the replica context")
LEARNING_RATE = 0.1
STEPS = 3


@pytest.fixture(params=KERAS_MODULES)
def keras(request):
    return keras_module(request.param)


def single_device_training(keras, steps=STEPS):
    """(gradients of the first step, weights after `steps`) with no strategy."""
    model = embedding_model(keras)
    first_gradients = None
    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = mean_squared_error(model)
        gradients = tape.gradient(loss, model.trainable_variables)
        first_gradients = first_gradients or [
            tf.convert_to_tensor(g).numpy() for g in gradients]
        for variable, gradient in zip(model.trainable_variables, gradients):
            variable.assign_sub(LEARNING_RATE * tf.convert_to_tensor(gradient))
    return first_gradients, model.get_weights()


def cross_replica_training(keras, strategy, traced, steps=STEPS):
    """The same training with the step called under strategy.scope(), no
    strategy.run; returns (model, gradients of the first step)."""
    with strategy.scope():
        model = embedding_model(keras)

    def train_step():
        with tf.GradientTape() as tape:
            loss = mean_squared_error(model)
        gradients = tape.gradient(loss, model.trainable_variables)
        for variable, gradient in zip(model.trainable_variables, gradients):
            variable.assign_sub(LEARNING_RATE * tf.convert_to_tensor(gradient))
        return gradients

    if traced:
        train_step = tf.function(train_step)
    first_gradients = None
    with strategy.scope():
        for _ in range(steps):
            gradients = train_step()
            first_gradients = first_gradients or gradients
    return model, first_gradients


@pytest.mark.parametrize("replicas", [2, 4])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf.function"])
def test_train_step_under_scope_matches_one_device(keras, configuration,
                                                   replicas, traced):
    strategy = tf.distribute.MirroredStrategy(DEVICES[:replicas])
    if configuration not in PATCHED_CONFIGURATIONS:
        with pytest.raises(ValueError, match=HANDLE_UNAVAILABLE):
            cross_replica_training(keras, strategy, traced, steps=1)
        return
    expected_gradients, expected_weights = single_device_training(keras)
    model, gradients = cross_replica_training(keras, strategy, traced)
    embedding_gradient = gradients[0]
    assert isinstance(embedding_gradient, tf.IndexedSlices)  # stays sparse
    for found, expected in zip(gradients, expected_gradients):
        np.testing.assert_allclose(tf.convert_to_tensor(found).numpy(),
                                   expected, rtol=1e-5, atol=1e-6)
    for variable, expected in zip(model.trainable_variables, expected_weights):
        replicas_values = [c.numpy() for c in tf_variable(variable).values]
        assert len(replicas_values) == replicas
        for value in replicas_values[1:]:
            np.testing.assert_array_equal(value, replicas_values[0])
        np.testing.assert_allclose(replicas_values[0], expected,
                                   rtol=1e-5, atol=1e-6)


def test_apply_gradients_inside_strategy_run_matches_one_device(keras, strategy):
    """The first way that works: the whole step in strategy.run, the batch
    split over the replicas, the optimizer applying in replica context."""
    _, expected_weights = single_device_training(keras, steps=2)
    with strategy.scope():
        model = embedding_model(keras)
        optimizer = keras.optimizers.SGD(LEARNING_RATE)
    per_replica = len(TOKENS) // strategy.num_replicas_in_sync
    shards = strategy.experimental_distribute_values_from_function(
        lambda context: tuple(
            array[per_replica * context.replica_id_in_sync_group:][:per_replica]
            for array in (TOKENS, LABELS)))

    @tf.function
    def distributed_step(tokens, labels):
        def replica_step(tokens, labels):
            with tf.GradientTape() as tape:
                # Each replica's loss is its share of the global mean.
                loss = (mean_squared_error(model, tokens, labels) /
                        strategy.num_replicas_in_sync)
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        strategy.run(replica_step, args=(tokens, labels))

    for _ in range(2):
        distributed_step(*shards)
    for found, expected in zip(model.get_weights(), expected_weights):
        np.testing.assert_allclose(found, expected, rtol=1e-5, atol=1e-6)


def dense_kernel(keras, strategy, **variable_options):
    """A built Dense layer's kernel, created under `strategy`."""
    with strategy.scope():
        layer = keras.layers.Dense(2, name="dense", **variable_options)
        layer.build((None, 3))
    return layer.kernel


def test_resolve_treats_a_keras_variable_as_the_tf_variable(keras, strategy):
    kernel = dense_kernel(keras, strategy)
    inner = tf_variable(kernel)
    assert isinstance(inner, tf.distribute.DistributedValues)
    assert_same_objects(tfdtape.resolve(kernel), tfdtape.resolve(inner))
    with strategy.scope():
        assert_same_objects(tfdtape.resolve(kernel), inner.values)
    seen = {}

    def replica_fn():
        context = tf.distribute.get_replica_context()
        replica_id = int(tf.get_static_value(context.replica_id_in_sync_group))
        seen[replica_id] = tfdtape.resolve(kernel)

    strategy.run(replica_fn)
    assert sorted(seen) == [0, 1, 2, 3]
    for resolved in seen.values():
        assert_same_objects(resolved, [inner])


def test_resolve_refuses_an_unbuilt_keras_variable():
    keras = tf.keras
    if not is_keras3(keras):
        pytest.skip(f"tf.keras is Keras 2 in TensorFlow {tf.__version__}: its "
                    "variables are tf.Variables, built when created")
    unbuilt = keras.Variable(initializer="zeros", shape=(2,), name="lazy")
    unbuilt.__dict__["_value"] = None  # as before a deferred build
    with pytest.raises(tfdtape.NotWatchableError,
                       match=r"Keras variable 'lazy' has no tf.Variable yet "
                             r"\(tfdtape.resolve\)"):
        tfdtape.resolve(unbuilt)


def watched_in(context_name, strategy, watch_what):
    """Runs a tape that only calls tape.watch(watch_what) in the named
    context; returns the list of what it watched, one list per replica in
    replica context."""
    seen = []

    def watch():
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(watch_what)
        seen.append(resolution.watched_by(tape))

    if context_name == "replica":
        strategy.run(watch)
    elif context_name == "cross-replica":
        with strategy.scope():
            watch()
    else:
        watch()
    return seen


@pytest.mark.parametrize("context_name", ["no strategy", "replica",
                                          "cross-replica"])
def test_watch_a_keras_variable(keras, strategy, configuration, context_name):
    kernel = dense_kernel(keras, strategy)
    inner = tf_variable(kernel)
    expected = {"no strategy": [inner], "replica": [inner],
                "cross-replica": list(inner.values)}[context_name]
    keras3 = is_keras3(keras)
    if configuration not in PATCHED_CONFIGURATIONS:
        if keras3:  # Stock TensorFlow does not take Keras 3 variables.
            with pytest.raises(ValueError, match="not tf.Tensor or tf.Variable"):
                watched_in(context_name, strategy, kernel)
            return
        if context_name == "cross-replica":
            with pytest.raises(ValueError, match=HANDLE_UNAVAILABLE):
                watched_in(context_name, strategy, kernel)
            return
    seen = watched_in(context_name, strategy, kernel)
    assert len(seen) == (4 if context_name == "replica" else 1)
    for watched in seen:
        # An explicit watch of a container in replica context watched the
        # container before the commit too; reads are what changed.
        assert_same_objects(watched, expected)


def test_cross_replica_gradient_for_keras_variables(keras, strategy, configuration):
    kernel = dense_kernel(keras, strategy)
    inner = tf_variable(kernel)
    coefficients = [1.0, 2.0, 3.0, 4.0]
    with strategy.scope():
        with tf.GradientTape() as tape:
            loss = tf.add_n([c * tf.reduce_sum(component) for c, component
                             in zip(coefficients, inner.values)])
        if configuration not in PATCHED_CONFIGURATIONS:
            with pytest.raises(ValueError, match=HANDLE_UNAVAILABLE):
                tape.gradient(loss, [kernel])
            return
        gradients = tape.gradient(loss, {"kernel": kernel})
    assert list(gradients) == ["kernel"]
    np.testing.assert_array_equal(gradients["kernel"].numpy(),
                                  np.full((3, 2), 10.0, np.float32))


def test_sync_on_read_keras_variable_is_refused(keras, strategy, configuration):
    with strategy.scope():
        if is_keras3(keras):
            total = keras.Variable(1.0, name="total", synchronization="on_read",
                                   aggregation="sum")
        else:
            total = keras.layers.Layer().add_weight(
                name="total", shape=(), initializer="ones", trainable=False,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.SUM)
        with tf.GradientTape() as tape:
            tape.watch(tf_variable(total).values[0])
            loss = 2.0 * tf_variable(total).values[0]
        if configuration not in PATCHED_CONFIGURATIONS:
            with pytest.raises(ValueError, match=HANDLE_UNAVAILABLE):
                tape.gradient(loss, total)
            return
        with pytest.raises(ValueError) as raised:
            tape.gradient(loss, total)
    text = str(raised.value)
    assert "found an ON_READ SyncOnReadVariable" in text
    assert "Compute the gradient inside strategy.run" in text


def test_trace_names_the_keras_path(strategy):
    keras = tf.keras
    kernel = dense_kernel(keras, strategy)
    with tfdtape.trace() as trace:
        with strategy.scope():
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                tape.watch(kernel)
    (event,) = trace.events
    assert event.kind == "watch"
    expected_name = "dense/kernel" if is_keras3(keras) else kernel.name
    assert trace.report().splitlines()[1].split()[1] == expected_name
