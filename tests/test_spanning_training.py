"""Proof on real loops: the tape around `strategy.run`, applied in
cross-replica context, trains as TensorFlow's tutorial step does.

Each loop of `spanning_training` trains STEPS steps of a `tf.data` pipeline
with Keras 3 (`tf.keras` from 2.16) or Keras 2 (`tf_keras`, or `tf.keras`
before 2.16) optimizers, eagerly and as a `tf.function`, under
MirroredStrategy(2) and (4). With tfdtape (with and without TensorFlow's
native resolver) the spanning loop's weights equal the canonical loop's,
every replica's copy identical and the weights moved; the pre-seed control
fails the same program (it raises, or trains differently). The canonical
loop itself trains bitwise alike on stock TensorFlow and with tfdtape.
"""

import pytest
import tensorflow as tf

import spanning_training
from keras_models import KERAS_MODULES
from keras_models import is_keras3
from keras_models import keras_module
from spanning_training import assert_trained_alike
from spanning_training import differs
from spanning_training import train
from tfdtape import keras2_aggregation
from tfdtape import targets
from tfdtape import testing

pytestmark = pytest.mark.per_release

CONFIGURATIONS = ("tfdtape", "tfdtape_alone", "pre_seed")
"""tfdtape with the native resolver, tfdtape alone, and the control."""

_canonical_results = {}


@pytest.fixture(params=CONFIGURATIONS)
def configuration(request):
    with testing.configuration(request.param):
        yield request.param


@pytest.fixture(params=[2, 4], ids=["mirrored_2", "mirrored_4"])
def replicas_strategy(request, strategy, strategy_of_two):
    return strategy_of_two if request.param == 2 else strategy


def canonical(keras_name, strategy, optimizer_name, traced):
    """The canonical loop's result on stock TensorFlow, computed once."""
    key = (keras_name, strategy.num_replicas_in_sync, optimizer_name, traced)
    if key not in _canonical_results:
        with testing.stock():
            _canonical_results[key] = train(
                keras_module(keras_name), strategy, "canonical",
                optimizer_name, traced)
    return _canonical_results[key]


def check_spanning(configuration, keras_name, strategy, optimizer_name,
                   traced, style="spanning", scope=True, skip_aggregation=True):
    expected, expected_iterations = canonical(keras_name, strategy,
                                              optimizer_name, traced)
    keras = keras_module(keras_name)
    if configuration == "pre_seed":
        try:
            found, _ = train(keras, strategy, style, optimizer_name, traced,
                             scope, skip_aggregation)
        except (ValueError, AttributeError, TypeError):
            return  # the handle error, None gradients, merge_call on None
        assert differs(found, expected)
        return
    found, iterations = train(keras, strategy, style, optimizer_name, traced,
                              scope, skip_aggregation)
    assert_trained_alike(found, expected, strategy.num_replicas_in_sync)
    if style == "spanning":
        assert iterations == expected_iterations == spanning_training.STEPS


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
@pytest.mark.parametrize("optimizer_name", spanning_training.OPTIMIZERS)
def test_keras_optimizers(configuration, optimizer_name, traced, strategy):
    check_spanning(configuration, "tf.keras", strategy, optimizer_name, traced)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
def test_two_replicas(configuration, traced, strategy_of_two):
    check_spanning(configuration, "tf.keras", strategy_of_two, "adam", traced)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
@pytest.mark.parametrize("optimizer_name", spanning_training.OPTIMIZERS)
def test_keras_2_optimizers_skip_aggregation(configuration, optimizer_name,
                                             traced, strategy):
    if "tf_keras" not in KERAS_MODULES and is_keras3(tf.keras):
        pytest.skip("tf_keras is not installed")
    name = "tf_keras" if "tf_keras" in KERAS_MODULES else "tf.keras"
    check_spanning(configuration, name, strategy, optimizer_name, traced)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
@pytest.mark.parametrize("optimizer_name", spanning_training.OPTIMIZERS)
def test_keras_2_optimizers_need_no_skip_aggregation(configuration, optimizer_name,
                                                     traced, strategy):
    """Without `skip_gradients_aggregation=True` the Keras 2 apply in
    cross-replica context hands the total on unaggregated
    (tfdtape.keras2_aggregation); the control fails (`merge_call` on None,
    or the handle error)."""
    if "tf_keras" not in KERAS_MODULES and is_keras3(tf.keras):
        pytest.skip("tf_keras is not installed")
    name = "tf_keras" if "tf_keras" in KERAS_MODULES else "tf.keras"
    check_spanning(configuration, name, strategy, optimizer_name, traced,
                   skip_aggregation=False)


def test_without_tfdtapes_aggregation_keras_2_fails_in_merge_call(strategy, monkeypatch):
    """The control: tfdtape installed, Keras 2's own aggregate_gradients."""
    name = "tf_keras" if "tf_keras" in KERAS_MODULES else "tf.keras"
    if name == "tf_keras":
        keras_module(name)  # skips without tf_keras
    for cls in keras2_aggregation.keras2_classes():
        current = vars(cls)[keras2_aggregation.ATTRIBUTE]
        monkeypatch.setattr(cls, keras2_aggregation.ATTRIBUTE, targets.original_of(current))
    with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'merge_call'"):
        train(keras_module(name), strategy, "spanning", "sgd", skip_aggregation=False)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
def test_a_step_with_no_scope_around_it(configuration, traced,
                                        replicas_strategy):
    check_spanning(configuration, "tf.keras", replicas_strategy, "momentum",
                   traced, scope=False)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
def test_applied_with_assign_sub(configuration, traced, replicas_strategy):
    check_spanning(configuration, "tf.keras", replicas_strategy, "sgd", traced,
                   style="spanning_assign_sub")


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
@pytest.mark.parametrize("optimizer_name", ["sgd", "adam"])
def test_a_keras_step_without_strategy_run_matches_one_device(
        configuration, optimizer_name, traced, strategy):
    keras = tf.keras
    expected, expected_iterations = train(keras, None, "one_device",
                                          optimizer_name, traced)
    if configuration == "pre_seed":
        with pytest.raises(ValueError, match="DistributedVariable.handle"):
            train(keras, strategy, "no_run", optimizer_name, traced)
        return
    found, iterations = train(keras, strategy, "no_run", optimizer_name, traced)
    assert_trained_alike(found, expected, strategy.num_replicas_in_sync)
    assert iterations == expected_iterations == spanning_training.STEPS


@pytest.mark.parametrize("optimizer_name", spanning_training.OPTIMIZERS)
@pytest.mark.parametrize("keras_name", KERAS_MODULES)
def test_the_canonical_loop_is_bitwise_stock(keras_name, optimizer_name,
                                             strategy):
    expected, expected_iterations = canonical(keras_name, strategy,
                                              optimizer_name, True)
    with testing.with_tfdtape():
        found, iterations = train(keras_module(keras_name), strategy,
                                  "canonical", optimizer_name, True)
    assert iterations == expected_iterations
    for copies, reference in zip(found, expected):
        for copy, stock_copy in zip(copies, reference):
            assert copy.tobytes() == stock_copy.tobytes()
