"""Training loops written both ways, for the tests of tapes around strategy.run.

Every loop trains the same small Keras model (Dense(4, tanh) -> Dense(1),
fixed weights) for STEPS batches of a `tf.data` pipeline, distributed with
`experimental_distribute_dataset`, and returns every replica's copy of
every weight:

- `canonical`: TensorFlow's tutorial step. Tape, gradient and
  `apply_gradients` inside `strategy.run`; the optimizer all-reduces.
- `spanning`: the loop most people write first. The tape around
  `strategy.run` and `strategy.reduce`, the gradient and `apply_gradients`
  in cross-replica context (`scope=False`: the step called outside any
  `strategy.scope()`, as a `tf.function` step often is).
- `spanning_assign_sub`: the spanning step applied by `assign_sub`.
- `no_run`: the whole batch in cross-replica context, no `strategy.run`
  (each step on one device); `one_device` is the same loop with no strategy.

A loop that fails raises what it raised; the tests decide what that means.
"""

import contextlib

import numpy as np
import tensorflow as tf

from keras_models import is_keras3

GLOBAL_BATCH = 8
STEPS = 3
LEARNING_RATE = 0.1
_RNG = np.random.default_rng(11)
FEATURES = _RNG.normal(0.0, 1.0, (GLOBAL_BATCH * STEPS, 3)).astype(np.float32)
LABELS = _RNG.normal(0.0, 1.0, (GLOBAL_BATCH * STEPS, 1)).astype(np.float32)
_WEIGHTS = [_RNG.normal(0.0, 0.5, shape).astype(np.float32)
            for shape in ((3, 4), (4,), (4, 1), (1,))]

OPTIMIZERS = ("sgd", "momentum", "adam")


def _optimizer(keras, name):
    if name == "sgd":
        return keras.optimizers.SGD(LEARNING_RATE)
    if name == "momentum":
        return keras.optimizers.SGD(LEARNING_RATE, momentum=0.9)
    return keras.optimizers.Adam(0.01)


def build(keras, strategy, optimizer_name):
    """(model, optimizer), created and built under `strategy` (None: none)."""
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = keras.Sequential([
            keras.Input((3,)),
            keras.layers.Dense(4, activation="tanh", name="hidden"),
            keras.layers.Dense(1, name="output"),
        ])
        model.set_weights(_WEIGHTS)
        optimizer = _optimizer(keras, optimizer_name)
        optimizer.build(model.trainable_variables)
    return model, optimizer


def replicas_of(variable):
    """Every replica's copy of a model weight, as numpy arrays."""
    inner = variable if isinstance(variable, tf.Variable) else variable.value
    if isinstance(inner, tf.distribute.DistributedValues):
        return [component.numpy() for component in inner.values]
    return [inner.numpy()]


def _apply_options(keras, skip_aggregation):
    """Keras 2 optimizers all-reduce gradients in apply_gradients through
    merge_call; a total derivative is aggregated already, which the program
    may say (`skip_aggregation`) or leave to tfdtape."""
    if is_keras3(keras) or not skip_aggregation:
        return {}
    return {"skip_gradients_aggregation": True}


def _squared_error_share(model, features, labels):
    """This replica's share of the global batch's mean squared error."""
    error = model(features) - labels
    return tf.nn.compute_average_loss(tf.reduce_sum(error * error, axis=1),
                                      global_batch_size=GLOBAL_BATCH)


def train(keras, strategy, style, optimizer_name="sgd", traced=False,
          scope=True, skip_aggregation=True):
    """Trains STEPS steps; returns ([every replica's copy of each weight],
    the optimizer's iterations; None for spanning_assign_sub). A Keras 2
    optimizer applying in cross-replica context is passed
    `skip_gradients_aggregation=True` if `skip_aggregation`."""
    model, optimizer = build(keras, strategy, optimizer_name)
    variables = model.trainable_variables
    dataset = tf.data.Dataset.from_tensor_slices((FEATURES, LABELS)).batch(
        GLOBAL_BATCH)

    def canonical(features, labels):
        def replica_step(features, labels):
            with tf.GradientTape() as tape:
                loss = _squared_error_share(model, features, labels)
            gradients = tape.gradient(loss, variables)
            optimizer.apply_gradients(zip(gradients, variables))
        strategy.run(replica_step, args=(features, labels))

    def spanning_gradients(features, labels):
        with tf.GradientTape() as tape:
            per_replica = strategy.run(_squared_error_share,
                                       args=(model, features, labels))
            loss = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica,
                                   axis=None)
        return tape.gradient(loss, variables)

    def spanning(features, labels):
        gradients = spanning_gradients(features, labels)
        optimizer.apply_gradients(zip(gradients, variables),
                                  **_apply_options(keras, skip_aggregation))

    def spanning_assign_sub(features, labels):
        gradients = spanning_gradients(features, labels)
        for variable, gradient in zip(variables, gradients):
            variable.assign_sub(LEARNING_RATE * gradient)

    def whole_batch(features, labels):
        with tf.GradientTape() as tape:
            loss = _squared_error_share(model, features, labels)
        gradients = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(gradients, variables),
                                  **_apply_options(keras, skip_aggregation))

    step = {"canonical": canonical, "spanning": spanning,
            "spanning_assign_sub": spanning_assign_sub,
            "no_run": whole_batch, "one_device": whole_batch}[style]
    if traced:
        step = tf.function(step)
    if style in ("canonical", "spanning", "spanning_assign_sub"):
        dataset = strategy.experimental_distribute_dataset(dataset)
    in_scope = strategy is not None and scope and style != "canonical"
    for features, labels in dataset:
        with strategy.scope() if in_scope else contextlib.nullcontext():
            step(features, labels)
    iterations = (None if style == "spanning_assign_sub"
                  else int(optimizer.iterations.numpy()))
    return [replicas_of(variable) for variable in variables], iterations


def assert_trained_alike(found, expected, replicas):
    """Asserts `found` (train()'s weights) has `replicas` identical copies of
    each weight, each close to `expected`'s first copy, and that training
    moved the weights."""
    assert len(found) == len(expected) == len(_WEIGHTS)
    for copies, reference, initial in zip(found, expected, _WEIGHTS):
        assert len(copies) == replicas
        for copy in copies[1:]:
            np.testing.assert_array_equal(copy, copies[0])
        np.testing.assert_allclose(copies[0], reference[0], rtol=1e-5, atol=1e-6)
        assert not np.allclose(copies[0], initial)


def differs(found, expected):
    """True unless `found` equals `expected` within assert_trained_alike's
    tolerance, replicas identical."""
    try:
        assert_trained_alike(found, expected, len(found[0]))
    except AssertionError:
        return True
    return False
