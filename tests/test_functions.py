"""The defun half of the commit: traced functions under MirroredStrategy."""

import sys

import pytest
import tensorflow as tf

import tfdtape
from assertions import assert_same_objects
from tfdtape import captured_inputs

pytestmark = pytest.mark.per_release


def replica_index():
    replica_id = tf.distribute.get_replica_context().replica_id_in_sync_group
    return int(tf.get_static_value(replica_id))


def test_captured_variable_reads_each_replicas_component(strategy, configuration):
    with strategy.scope():
        v = tf.Variable(0.0)
    for index, component in enumerate(v.values):
        component.assign(float(index + 1))  # make the components tell apart
    square = tf.function(lambda: v * v, autograph=False)
    watched = {}

    def step():
        with tf.GradientTape() as tape:
            loss = square()
        watched[replica_index()] = tape.watched_variables()
        return loss, tape.gradient(loss, v)

    losses, gradients = strategy.run(step)
    assert [float(x) for x in strategy.experimental_local_results(losses)] == [
        1.0, 4.0, 9.0, 16.0]
    assert [float(g) for g in strategy.experimental_local_results(gradients)] == [
        2.0, 4.0, 6.0, 8.0]
    for replica_id, found in watched.items():
        if configuration == "pre_seed":
            assert_same_objects(found, [v.values[replica_id]])
        else:
            assert_same_objects(found, [v])


def test_variable_created_in_a_traced_function_is_distributed(strategy, configuration):
    created = []

    @tf.function(autograph=False)
    def make_variable():
        if not created:
            created.append(tf.Variable(2.0))
        return created[0].read_value()

    with strategy.scope():
        value = make_variable()
    assert float(value) == 2.0
    assert isinstance(created[0], tf.distribute.DistributedValues)
    assert type(created[0]).__name__ == "MirroredVariable"
    assert len(created[0].values) == 4


def test_func_graph_inherits_the_variable_creator_stack(strategy):
    seen = []

    @tf.function(autograph=False)
    def record_stack():
        seen.append(tf.compat.v1.get_default_graph()._variable_creator_stack)
        return tf.constant(0.0)

    with strategy.scope():
        outer = tf.compat.v1.get_default_graph()._variable_creator_stack
        record_stack()
    strategy_creators = [creator for _, creator in outer]
    assert len(strategy_creators) == 1
    assert strategy_creators[0] in [creator for _, creator in seen[0]]


def concrete_function_class():
    """The class of tf.function's concrete functions in this TensorFlow."""
    return type(tf.function(lambda: tf.constant(1.0)).get_concrete_function())


def test_no_captured_input_resolution_in_this_tensorflow():
    assert captured_inputs.classes_with_captured_input_resolution() == []
    assert concrete_function_class() in captured_inputs.function_classes()


def test_captured_input_resolution_is_removed_where_present(monkeypatch):
    """A TensorFlow that still resolved captured inputs per call gets the
    commit's behaviour: captured inputs are used as traced."""
    function_class = concrete_function_class()
    # Defined in the class's own module, as TensorFlow's method was: a
    # function from elsewhere would be another library's patch, which
    # install() refuses.
    namespace = {}
    exec("def resolve_per_call(self):\n    return ['resolved per call']\n",
         vars(sys.modules[function_class.__module__]), namespace)
    resolve_per_call = namespace["resolve_per_call"]
    tfdtape.uninstall()
    try:
        monkeypatch.setattr(function_class,
                            captured_inputs.RESOLVER_METHOD, resolve_per_call,
                            raising=False)
        assert captured_inputs.classes_with_captured_input_resolution() == [
            function_class]
        tfdtape.install()
        holder = type("Holder", (), {"_captured_inputs": ["as traced"]})()
        replacement = vars(function_class)[captured_inputs.RESOLVER_METHOD]
        assert replacement is not resolve_per_call
        assert replacement(holder) == ["as traced"]
        tfdtape.uninstall()
        assert vars(function_class)[
            captured_inputs.RESOLVER_METHOD] is resolve_per_call
    finally:
        tfdtape.uninstall()
        monkeypatch.undo()
        tfdtape.install()
    assert captured_inputs.RESOLVER_METHOD not in vars(function_class)
