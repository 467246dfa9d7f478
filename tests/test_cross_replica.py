"""Cross-replica context: the tape watches every local component.

The commit's row (direct tape calls resolve to all components) holds on stock
TensorFlow and with tfdtape; the pre-seed control fails there. The public API
(`GradientTape.watch` and `gradient` on a distributed variable) crashes in
stock TensorFlow and in the control; tfdtape makes it work.
"""

import pytest
import tensorflow as tf
from tensorflow.python.eager import tape as tape_module

import releases
from assertions import assert_same_objects
from tfdtape import resolution
from tfdtape.testing import PATCHED_CONFIGURATIONS

pytestmark = pytest.mark.per_release

HANDLE_UNAVAILABLE = ("DistributedVariable.handle is not available outside "
                      "the replica context")
COEFFICIENTS = [1.0, 2.0, 3.0, 4.0]


def weighted_component_sum(variable):
    """A loss that reads each local component with its own coefficient."""
    return tf.add_n([c * tf.reduce_sum(component) for c, component
                     in zip(COEFFICIENTS, variable.values)])


def crashes_without_tfdtape(configuration, call):
    """Where tfdtape is not installed, asserts call() raises TensorFlow's
    handle ValueError and returns True; elsewhere returns False, calling nothing."""
    if configuration in PATCHED_CONFIGURATIONS:
        return False
    with pytest.raises(ValueError, match=HANDLE_UNAVAILABLE):
        call()
    return True


@pytest.mark.parametrize("call", ["watch_variable", "variable_accessed",
                                  "variables_accessed"])
def test_direct_tape_calls_resolve_to_components(strategy, configuration, call):
    calls = {
        "watch_variable": lambda tape, v: tape_module.watch_variable(tape._tape, v),
        "variable_accessed": lambda tape, v: tape_module.variable_accessed(v),
        "variables_accessed": lambda tape, v: tape_module.variables_accessed([v]),
    }
    with strategy.scope():
        v = tf.Variable(3.0)
        watches_reads = call != "watch_variable"
        with tf.GradientTape(watch_accessed_variables=watches_reads) as tape:
            if configuration == "pre_seed":
                error, message = releases.unresolved_container_error(call)
                with pytest.raises(error) as raised:
                    calls[call](tape, v)
                assert type(raised.value) is error
                assert str(raised.value).startswith(message)
                return
            calls[call](tape, v)
    assert_same_objects(resolution.watched_by(tape), v.values)
    # Listed once with tfdtape; stock lists the components.
    assert_same_objects(tape.watched_variables(),
                        [v] if configuration in PATCHED_CONFIGURATIONS else v.values)


def test_direct_tape_calls_on_a_plain_variable(strategy, configuration):
    with strategy.scope():
        v = tf.Variable(3.0)
        plain = v.values[2]
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape_module.watch_variable(tape._tape, plain)
    assert_same_objects(tape.watched_variables(), [plain])


def test_public_watch_watches_all_components(strategy, configuration):
    with strategy.scope():
        v = tf.Variable(3.0)
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            if crashes_without_tfdtape(configuration, lambda: tape.watch(v)):
                return
            tape.watch(v)
            loss = weighted_component_sum(v)
        assert_same_objects(resolution.watched_by(tape), v.values)
        assert_same_objects(tape.watched_variables(), [v])
        assert float(tape.gradient(loss, v)) == sum(COEFFICIENTS)


def test_gradient_is_the_sum_over_components(strategy, configuration):
    with strategy.scope():
        v = tf.Variable(3.0)
        with tf.GradientTape() as tape:
            loss = weighted_component_sum(v)
        if crashes_without_tfdtape(configuration, lambda: tape.gradient(loss, v)):
            return
        gradient = tape.gradient(loss, v)
    assert float(gradient) == 10.0


def test_gradient_of_a_plain_read(strategy, configuration):
    """Reading the variable in cross-replica context reads one component."""
    with strategy.scope():
        v = tf.Variable(3.0)
        with tf.GradientTape() as tape:
            loss = v * v
        if crashes_without_tfdtape(configuration, lambda: tape.gradient(loss, v)):
            return
        assert float(tape.gradient(loss, v)) == 6.0


@pytest.mark.parametrize("configuration", PATCHED_CONFIGURATIONS, indirect=True)
def test_unconnected_sources(strategy, configuration):
    with strategy.scope():
        v = tf.Variable(3.0)
        unused = tf.Variable(1.0)
        with tf.GradientTape(persistent=True) as tape:
            loss = weighted_component_sum(v)
        assert tape.gradient(loss, unused) is None
        zero = tape.gradient(loss, unused,
                             unconnected_gradients=tf.UnconnectedGradients.ZERO)
    assert isinstance(zero, tf.Tensor) and float(zero) == 0.0


@pytest.mark.parametrize("configuration", PATCHED_CONFIGURATIONS, indirect=True)
def test_sparse_gradients_stay_sparse(strategy, configuration):
    with strategy.scope():
        v = tf.Variable([[1.0], [2.0], [3.0]])
        with tf.GradientTape() as tape:
            loss = tf.add_n([
                c * tf.reduce_sum(tf.gather(component, [index % 3]))
                for index, (c, component)
                in enumerate(zip(COEFFICIENTS, v.values))])
        gradient = tape.gradient(loss, v)
    assert isinstance(gradient, tf.IndexedSlices)
    assert gradient.indices.numpy().tolist() == [0, 1, 2, 0]
    assert tf.convert_to_tensor(gradient).numpy().tolist() == [[5.0], [2.0], [3.0]]


@pytest.mark.parametrize("configuration", PATCHED_CONFIGURATIONS, indirect=True)
def test_mixed_sparse_and_dense_gradients_are_densified(strategy, configuration):
    with strategy.scope():
        v = tf.Variable([[1.0], [2.0]])
        with tf.GradientTape() as tape:
            components = v.values
            loss = (tf.reduce_sum(tf.gather(components[0], [1])) +
                    3.0 * tf.reduce_sum(components[1]))
        gradient = tape.gradient(loss, v)
    assert isinstance(gradient, tf.Tensor)
    assert gradient.numpy().tolist() == [[3.0], [4.0]]


@pytest.mark.parametrize("configuration", PATCHED_CONFIGURATIONS, indirect=True)
def test_nested_sources_keep_their_structure(strategy, configuration):
    plain = tf.Variable(7.0)
    with strategy.scope():
        v = tf.Variable(3.0)
        w = tf.Variable(5.0)
        x = tf.constant(2.0)
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = weighted_component_sum(v) + w * x + plain * plain
        gradients = tape.gradient(loss, {"v": v, "rest": [w, (plain, x)]})
    assert sorted(gradients) == ["rest", "v"]
    assert float(gradients["v"]) == 10.0
    w_gradient, (plain_gradient, x_gradient) = gradients["rest"]
    assert (float(w_gradient), float(plain_gradient), float(x_gradient)) == (
        2.0, 14.0, 5.0)


def test_sync_on_read_source_is_refused(strategy, configuration):
    with strategy.scope():
        v = tf.Variable(3.0, name="per_replica_total",
                        synchronization=tf.VariableSynchronization.ON_READ,
                        aggregation=tf.VariableAggregation.SUM)
        with tf.GradientTape() as tape:
            loss = weighted_component_sum(v)
        if crashes_without_tfdtape(configuration, lambda: tape.gradient(loss, v)):
            return
        with pytest.raises(ValueError) as raised:
            tape.gradient(loss, v)
    text = str(raised.value)
    assert "'per_replica_total:0'" in text
    assert "found an ON_READ SyncOnReadVariable" in text
    assert f"in TensorFlow {tf.__version__}" in text
    assert "Compute the gradient inside strategy.run" in text
