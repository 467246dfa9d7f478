"""Bad input to watch / resolve: a clear error, and the tape stays usable."""

import contextlib

import numpy as np
import pytest
import tensorflow as tf

import tfdtape
from assertions import assert_same_objects
from tfdtape.testing import PATCHED_CONFIGURATIONS

pytestmark = pytest.mark.per_release


def per_replica_value(strategy):
    return strategy.run(lambda: tf.constant(1.0))


BAD_INPUTS = {
    "None": (lambda strategy: None, "found None of type NoneType"),
    "str": (lambda strategy: "weights", "found 'weights' of type str"),
    "float": (lambda strategy: 1.5, "found 1.5 of type float"),
}

NOT_RESOLVABLE = {
    **BAD_INPUTS,
    "PerReplica": (per_replica_value,
                   "found a PerReplica holding one value per replica"),
    "list": (lambda strategy: [tf.constant(1.0)],
             "found an object of type list"),
    "dict": (lambda strategy: {"w": tf.constant(1.0)},
             "found an object of type dict"),
    "ndarray": (lambda strategy: np.ones(2, np.float32),
                "found an object of type ndarray"),
    "Module": (lambda strategy: tf.Module(), "found an object of type Module"),
}


@pytest.mark.parametrize("configuration", PATCHED_CONFIGURATIONS, indirect=True)
@pytest.mark.parametrize("bad", sorted(BAD_INPUTS))
def test_watch_rejects_and_the_tape_stays_usable(strategy, configuration, bad):
    make_bad, found = BAD_INPUTS[bad]
    value = make_bad(strategy)
    v = tf.Variable(3.0)
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        with pytest.raises(ValueError) as raised:
            tape.watch([v, value])
        assert isinstance(raised.value, TypeError)  # NotWatchableError is both
        assert len(tape.watched_variables()) == 0  # nothing half-watched
        tape.watch(v)
        loss = v * v
    assert_same_objects(tape.watched_variables(), [v])
    assert float(tape.gradient(loss, v)) == 6.0
    text = str(raised.value)
    assert text.startswith("tfdtape: cannot watch")
    assert "(tf.GradientTape.watch)" in text
    assert found in text
    assert f"in TensorFlow {tf.__version__}." in text


@pytest.mark.parametrize("bad", sorted(NOT_RESOLVABLE))
def test_resolve_rejects(strategy, bad):
    make_bad, found = NOT_RESOLVABLE[bad]
    value = make_bad(strategy)
    for context in (contextlib.nullcontext(), strategy.scope()):
        with context, pytest.raises(tfdtape.NotWatchableError) as raised:
            tfdtape.resolve(value)
        text = str(raised.value)
        assert "(tfdtape.resolve)" in text and found in text


def test_watch_rejects_an_arbitrary_object():
    with tf.GradientTape() as tape:
        with pytest.raises(ValueError, match=(
                r"tfdtape: cannot watch this object \(tf.GradientTape.watch\): "
                r"expected a tf.Tensor, tf.Variable or ExtensionType, found an "
                r"object of type object")):
            tape.watch(object())


def test_resolve_returns_a_tensor_unchanged(strategy):
    x = tf.constant(2.0)
    assert_same_objects(tfdtape.resolve(x), [x])
    with strategy.scope():
        assert_same_objects(tfdtape.resolve(x), [x])


def test_resolve_follows_the_context(strategy):
    plain = tf.Variable(1.0)
    with strategy.scope():
        v = tf.Variable(1.0)
        assert_same_objects(tfdtape.resolve(v), v.values)
        assert_same_objects(tfdtape.resolve(v.values[1]), [v.values[1]])
        assert_same_objects(tfdtape.resolve(plain), [plain])
    assert isinstance(tfdtape.resolve(v), tuple)
    seen = {}

    def replica_fn():
        replica_id = tf.get_static_value(
            tf.distribute.get_replica_context().replica_id_in_sync_group)
        seen[int(replica_id)] = (tfdtape.resolve(v)[0] is v,
                                 tfdtape.resolve(v.values[replica_id])[0] is v,
                                 tfdtape.resolve(plain)[0] is plain)

    strategy.run(replica_fn)
    assert seen == {index: (True, True, True) for index in range(4)}
    # With no strategy, the default strategy's container is the value itself.
    assert_same_objects(tfdtape.resolve(v.values[0]), [v.values[0]])


def test_watching_an_integer_tensor_warns_in_tensorflows_words(
        configuration, caplog):
    with caplog.at_level("WARNING", logger="tensorflow"):
        with tf.GradientTape() as tape:
            tape.watch(tf.constant(1))
    assert [record.getMessage() for record in caplog.records
            if "watched tensor" in record.getMessage()] == [
        "The dtype of the watched tensor must be floating (e.g. tf.float32), "
        "got tf.int32"]
