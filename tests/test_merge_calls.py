"""`maybe_merge_call` in cross-replica context, in every module exporting it.

With tfdtape installed, `tf.__internal__.distribute.interim.maybe_merge_call`
(and the same function under `tf.compat.v2`, a separate module object that
tf_keras uses) calls its function once with the current strategy in
cross-replica context, as `merge_call` would for the replicas. Stock
TensorFlow and the control fail there ('NoneType' object has no attribute
'merge_call'). In replica context and with no strategy TensorFlow's own
function runs.
"""

import sys

import pytest
import tensorflow as tf
from tensorflow.python.distribute import merge_call_interim

import tfdtape
from tfdtape import merge_calls
from tfdtape import targets
from tfdtape.testing import PATCHED_CONFIGURATIONS

pytestmark = pytest.mark.per_release

EXPORTS = {
    "tf.__internal__": lambda: tf.__internal__.distribute.interim,
    "tf.compat.v2.__internal__": lambda: tf.compat.v2.__internal__.distribute.interim,
}


@pytest.mark.parametrize("export", sorted(EXPORTS))
def test_cross_replica_context_calls_the_function_with_the_strategy(
        strategy, configuration, export):
    calls = []

    def merge_fn(distribution, value, scale=1.0):
        calls.append((distribution, tf.distribute.in_cross_replica_context()))
        return value * scale

    maybe_merge_call = EXPORTS[export]().maybe_merge_call
    with strategy.scope():
        if configuration not in PATCHED_CONFIGURATIONS:
            with pytest.raises(AttributeError, match="merge_call"):
                maybe_merge_call(merge_fn, strategy, tf.constant(2.0), scale=3.0)
            return
        result = maybe_merge_call(merge_fn, strategy, tf.constant(2.0), scale=3.0)
    assert float(result) == 6.0
    assert len(calls) == 1
    assert calls[0][0] is strategy and calls[0][1] is True


def test_replica_context_goes_through_merge_call_unchanged(strategy, configuration):
    """Inside strategy.run, TensorFlow's merge_call runs fn once for all
    replicas, with the per-replica values grouped."""
    calls = []

    def merge_fn(distribution, value):
        calls.append(distribution)
        return distribution.reduce("SUM", value, axis=None)

    def replica():
        replica_id = tf.distribute.get_replica_context().replica_id_in_sync_group
        return tf.__internal__.distribute.interim.maybe_merge_call(
            merge_fn, strategy, tf.cast(replica_id, tf.float32) + 1.0)

    results = strategy.experimental_local_results(strategy.run(replica))
    assert [float(r) for r in results] == [10.0]  # one tensor, for every replica
    assert calls == [strategy]


def test_no_strategy_calls_fn_directly(configuration):
    default = tf.distribute.get_strategy()
    calls = []
    result = tf.__internal__.distribute.interim.maybe_merge_call(
        lambda distribution, x: calls.append(distribution) or x + 1.0,
        default, tf.constant(1.0))
    assert float(result) == 2.0 and calls == [default]


def test_every_module_holding_it_is_patched_and_restored():
    holders = [name for name, module in list(sys.modules.items())
               if type(getattr(module, "__dict__", None)) is dict and
               targets.original_of(vars(module).get("maybe_merge_call"))]
    assert "tensorflow.python.distribute.merge_call_interim" in holders
    assert "tensorflow._api.v2.__internal__.distribute.interim" in holders
    assert "tensorflow._api.v2.compat.v2.__internal__.distribute.interim" in holders
    original = targets.original_of(merge_call_interim.maybe_merge_call)
    assert original.__module__ == "tensorflow.python.distribute.merge_call_interim"
    tfdtape.uninstall()
    try:
        for name in holders:
            assert vars(sys.modules[name])["maybe_merge_call"] is original
        assert tf.compat.v2.__internal__.distribute.interim.maybe_merge_call is original
    finally:
        tfdtape.install()
    for name in holders:
        assert targets.original_of(vars(sys.modules[name])["maybe_merge_call"]) is original


def test_lazy_modules_are_not_imported_by_the_search(monkeypatch):
    """The search reads module namespaces; it never triggers a lazy load."""

    class Lazy(type(sys)):
        def __getattr__(self, name):
            raise AssertionError(f"lazy module asked for {name!r}")

    lazy = Lazy("tfdtape_test_lazy_module")
    monkeypatch.setitem(sys.modules, lazy.__name__, lazy)
    found = merge_calls.modules_holding(lambda value: True)
    assert lazy not in found
    assert found[0] is merge_call_interim


def test_an_untouched_optimizer_step_in_replica_context_is_bitwise_stock(strategy):
    """A Keras step inside strategy.run gives bitwise the same weights with
    tfdtape installed as on stock TensorFlow (maybe_merge_call runs TensorFlow's
    own path there)."""
    from tfdtape import testing

    def trained():
        with strategy.scope():
            layer = tf.keras.layers.Dense(2, kernel_initializer="ones")
            layer.build((None, 3))
            optimizer = tf.keras.optimizers.SGD(0.1, momentum=0.9)

        def step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(layer(tf.ones((2, 3))) ** 2)
            gradients = tape.gradient(loss, layer.trainable_variables)
            optimizer.apply_gradients(zip(gradients, layer.trainable_variables))

        for _ in range(2):
            strategy.run(step)
        return [v.numpy().tobytes() for v in layer.weights]

    with testing.stock():
        expected = trained()
    assert trained() == expected


def test_per_replica_gradients_applied_in_cross_replica_context_are_refused(
        strategy, configuration):
    """Gradients returned from strategy.run, applied outside it: each
    replica's copy would get its own gradient (the replicas would drift
    apart); stock fails in merge_call."""
    with strategy.scope():
        layer = tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
        layer.build((None, 1))
        optimizer = tf.keras.optimizers.SGD(1.0)
        optimizer.build(layer.trainable_variables)
    features = strategy.experimental_distribute_values_from_function(
        lambda context: tf.constant(
            [[float(context.replica_id_in_sync_group + 1)]]))

    def replica(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(x))
        return tape.gradient(loss, layer.trainable_variables)

    with strategy.scope():
        gradients = strategy.run(replica, args=(features,))
        expected = ((ValueError, "tfdtape: cannot apply per-replica values in "
                     "cross-replica context") if configuration in PATCHED_CONFIGURATIONS
                    else (AttributeError, "merge_call"))
        options = ({"skip_gradients_aggregation": True}
                   if isinstance(optimizer.iterations, tf.Variable) else {})
        with pytest.raises(expected[0], match=expected[1]):
            optimizer.apply_gradients(zip(gradients, layer.trainable_variables),
                                      **options)
    kernel = layer.trainable_variables[0]
    inner = kernel if isinstance(kernel, tf.Variable) else kernel.value
    assert [c.numpy().tolist() for c in inner.values] == [[[1.0]]] * 4
