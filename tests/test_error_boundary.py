"""Errors that pass through tfdtape's code say what the user did.

The case found (issue 36): gradients returned from `strategy.run` (a tape
inside a `tf.function` replica function) applied with no scope around the
apply reached a TensorFlow internal of the default strategy ("worker_devices()
method unsupported by default tf.distribute.Strategy") through tfdtape's
reduce_to. With no scope, and under another strategy's scope, the apply is
now refused as in the scope, with tfdtape's message; stock raises
TensorFlow's own errors (the control). And `tfdtape.boundary`: an error
TensorFlow raises inside tfdtape's own steps comes out as tfdtape's, with
TensorFlow's chained.
"""

import contextlib

import pytest
import tensorflow as tf

from keras_models import is_keras3
from keras_models import keras_module
from tfdtape import boundary
from tfdtape import component_totals
from tfdtape import events
from tfdtape.testing import PATCHED_CONFIGURATIONS

pytestmark = pytest.mark.per_release

STOCK_ERRORS = {
    # Keras all-reduces through the default replica context, whose gradient
    # registration refuses the PerReplica.
    "no_scope": "Type PerReplica is not supported as a gradient source",
    "scope": "'NoneType' object has no attribute 'merge_call'",
    "other_scope": "'NoneType' object has no attribute 'merge_call'",
}
NO_SCOPE = ("tfdtape: cannot apply per-replica values outside their "
            "strategy's scope (tf.distribute.ReplicaContext.all_reduce)")
IN_CROSS_REPLICA_CONTEXT = "tfdtape: cannot apply per-replica values in cross-replica context"
APPLY_SYMBOL = {  # Keras 3's apply refuses in maybe_merge_call, Keras 2's first
    True: "tf.__internal__.distribute.interim.maybe_merge_call",
    False: "Optimizer.apply_gradients (Keras 2)",
}


def refusal(where, keras3):
    """How tfdtape's refusal of the apply begins."""
    if where == "no_scope":
        return NO_SCOPE  # Keras 2 and 3 all-reduce there
    return f"{IN_CROSS_REPLICA_CONTEXT} ({APPLY_SYMBOL[keras3]})"


def apply_scope(where, strategy):
    if where == "scope":
        return strategy.scope()
    if where == "other_scope":
        return tf.distribute.OneDeviceStrategy(strategy.extended.worker_devices[-1]).scope()
    return contextlib.nullcontext()


@pytest.mark.parametrize("keras_name", ["tf.keras", "tf_keras"])
@pytest.mark.parametrize("where", sorted(STOCK_ERRORS))
def test_gradients_returned_from_strategy_run_applied_outside_are_refused(
        strategy_of_two, configuration, where, keras_name):
    keras = keras_module(keras_name)
    strategy = strategy_of_two
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(1)])
        model.build((None, 3))
        optimizer = keras.optimizers.SGD(0.1)

    @tf.function
    def replica_gradients(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        return tape.gradient(loss, model.trainable_variables)

    before = [v.numpy() for v in model.trainable_variables]
    grads = strategy.run(replica_gradients, args=(tf.ones((4, 3)),))
    assert isinstance(grads[0], tf.distribute.DistributedValues)
    with pytest.raises((ValueError, AttributeError)) as raised:
        with apply_scope(where, strategy):
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
    if configuration in PATCHED_CONFIGURATIONS:
        assert raised.type is ValueError
        assert str(raised.value).startswith(refusal(where, is_keras3(keras)))
        assert str(raised.value).endswith(
            "Apply inside the function you pass to strategy.run (the optimizer "
            "all-reduces there), or reduce the values first.")
    else:
        assert STOCK_ERRORS[where] in str(raised.value)
    for value, old in zip(model.trainable_variables, before):
        assert (value.numpy() == old).all()


def test_a_tensorflow_error_in_tfdtapes_steps_becomes_tfdtapes(strategy_of_two,
                                                                monkeypatch):
    """An internal failing inside `_differentiate`'s totals (stood in for by
    the strategy's reduction raising) comes out as tfdtape's error of the
    same type, TensorFlow's chained, reported as a refusal."""
    internal = RuntimeError("worker_devices() method unsupported by default "
                            "tf.distribute.Strategy.")

    def failing(pairs):
        raise internal

    monkeypatch.setattr(component_totals, "reduce", failing)
    refusals = []

    class Sink:
        complete = True
        records_untaped = False

        def add_event(self, event):
            del event

        def add_gradient(self, event):
            del event

        def add_refusal(self, event):
            refusals.append(event.message)

    with strategy_of_two.scope():
        v = tf.Variable(3.0)
        with tf.GradientTape() as tape:
            loss = strategy_of_two.reduce(
                "SUM", strategy_of_two.run(lambda: v * v), axis=None)
        sink = Sink()
        events.open_sink(sink)
        try:
            with pytest.raises(RuntimeError) as raised:
                tape.gradient(loss, v)
        finally:
            events.close_sink(sink)
    message = str(raised.value)
    assert message.startswith(
        "tfdtape: cannot finish totalling the gradients of distributed sources "
        "(tf.GradientTape.gradient): expected TensorFlow to accept what tfdtape "
        "passed on from the program, found RuntimeError from TensorFlow: "
        "worker_devices() method unsupported by default tf.distribute.Strategy. "
        "in TensorFlow ")
    assert message.endswith(boundary.REPORT + ".")
    assert raised.value.__cause__ is internal
    assert refusals == [message]


@pytest.mark.parametrize("error", [
    ValueError("tfdtape: already tfdtape's (x): expected a, found b."),
    tf.errors.InvalidArgumentError(None, None, "an op failed"),
    KeyboardInterrupt(),
    OSError("not translated"),
], ids=["tfdtapes_own", "op_error", "keyboard_interrupt", "other_type"])
def test_what_the_boundary_leaves_alone(error):
    with pytest.raises(type(error)) as raised:
        with boundary.translated("doing something", "tf.Something"):
            raise error
    assert raised.value is error


def test_the_boundary_keeps_the_type_and_chains_the_original():
    original = TypeError("Type PerReplica is not supported\nsecond line")
    with pytest.raises(TypeError) as raised:
        with boundary.translated("doing something", "tf.Something", "Do this"):
            raise original
    assert raised.value.__cause__ is original
    assert str(raised.value).startswith(
        "tfdtape: cannot finish doing something (tf.Something): expected "
        "TensorFlow to accept what tfdtape passed on from the program, found "
        "TypeError from TensorFlow: Type PerReplica is not supported in TensorFlow ")
    assert str(raised.value).endswith(". Do this.")


@pytest.mark.parametrize("keras_name", ["tf.keras", "tf_keras"])
@pytest.mark.parametrize("built", [True, False], ids=["built", "unbuilt"])
def test_a_total_applied_in_another_strategys_scope_is_refused(
        strategy_of_two, configuration, keras_name, built):
    """Found by the generated programs: a Keras 3 optimizer made in a
    MirroredStrategy's scope, applying the total of a tape around
    strategy.run inside a OneDeviceStrategy's scope, failed in Keras's cast
    ("tuple indices must be integers or slices, not str")."""
    keras = keras_module(keras_name)
    strategy = strategy_of_two
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(1)])
        model.build((None, 3))
        optimizer = keras.optimizers.SGD(0.1)
        if built:
            optimizer.build(model.trainable_variables)
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", strategy.run(
                lambda: tf.reduce_sum(model(tf.ones((2, 3))))), axis=None)
        if configuration not in PATCHED_CONFIGURATIONS:
            with pytest.raises(ValueError, match="handle is not available"):
                tape.gradient(loss, model.trainable_variables)
            return
        grads = tape.gradient(loss, model.trainable_variables)
    before = [v.numpy() for v in model.trainable_variables]
    other = tf.distribute.OneDeviceStrategy(strategy.extended.worker_devices[-1])
    with pytest.raises(ValueError) as raised:
        with other.scope():
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
    symbol = APPLY_SYMBOL[is_keras3(keras)]
    assert str(raised.value).startswith(
        f"tfdtape: cannot apply gradients in another strategy's scope "
        f"({symbol}): expected the "
        "scope of the strategy the optimizer was made in (MirroredStrategy), "
        "or no scope, found the scope of another OneDeviceStrategy")
    for value, old in zip(model.trainable_variables, before):
        assert (value.numpy() == old).all()
    with strategy.scope():  # where it was made: the same gradients apply
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
    assert not (model.trainable_variables[0].numpy() == before[0]).all()


@pytest.mark.parametrize("keras_name", ["tf.keras", "tf_keras"])
@pytest.mark.parametrize("apply_in", ["scope", "no_scope"])
def test_an_optimizer_made_outside_every_scope_is_refused(
        strategy_of_two, keras_name, apply_in):
    """Found by the break-it review: Adam made (and built) outside every
    scope, applying the total of a tape around strategy.run to a mirrored
    variable in the strategy's scope, advanced its one set of moments once
    per copy: the copies drifted apart, silently ([0.669 1.668] and
    [0.619 1.617] against one device's [0.702 1.701] after three steps).
    With no scope open Keras failed in TensorFlow's own update."""
    keras = keras_module(keras_name)
    strategy = strategy_of_two
    with strategy.scope():
        v = tf.Variable([1.0, 2.0])
    optimizer = keras.optimizers.Adam(0.1)
    optimizer.build([v])
    with strategy.scope():
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", strategy.run(
                lambda: tf.reduce_sum(v * v) / 2), axis=None)
        gradient = tape.gradient(loss, v)
    with pytest.raises(ValueError) as raised:
        with strategy.scope() if apply_in == "scope" else contextlib.nullcontext():
            optimizer.apply_gradients([(gradient, v)])
    assert "tfdtape: cannot apply with an optimizer made outside strategy.scope()" in str(
        raised.value)
    assert str(raised.value).endswith(
        "Make the optimizer inside the MirroredStrategy's scope, as the model.")
    assert [list(c.numpy()) for c in strategy.experimental_local_results(v)] == [
        [1.0, 2.0], [1.0, 2.0]]


@pytest.mark.parametrize("keras_name", ["tf.keras", "tf_keras"])
@pytest.mark.parametrize("made_in", ["no_scope", "other_scope"])
def test_variables_of_another_strategy_are_refused(strategy_of_two, keras_name, made_in):
    """Found by the break-it review: a MirroredStrategy's variables updated in
    a OneDeviceStrategy's scope (plain gradients, as stock reaches the apply
    too) raised TensorFlow's "Mixing different tf.distribute.Strategy
    objects" from tfdtape's apply (stock: the merge_call error)."""
    keras = keras_module(keras_name)
    strategy = strategy_of_two
    other = tf.distribute.OneDeviceStrategy(strategy.extended.worker_devices[-1])
    with strategy.scope():
        v = tf.Variable([1.0, 2.0])
    with other.scope() if made_in == "other_scope" else contextlib.nullcontext():
        optimizer = keras.optimizers.SGD(0.1)
    with pytest.raises(ValueError) as raised:
        with other.scope():
            optimizer.apply_gradients([(tf.constant([1.0, 1.0]), v)])
    expected = ("cannot apply gradients in another strategy's scope"
                if made_in == "other_scope" else
                "cannot apply with an optimizer made outside strategy.scope()")
    assert str(raised.value).startswith(f"tfdtape: {expected}")
    assert [list(c.numpy()) for c in strategy.experimental_local_results(v)] == [
        [1.0, 2.0], [1.0, 2.0]]
