"""No silent share of a gradient: the cases a search over generated programs
found (issue 22), each in every configuration with its closed-form value.

- An explicit watch (`watch_accessed_variables=False`, `tape.watch(w)`)
  outside any strategy, on an eager tape recording a `tf.function` that runs
  the replicas: the total over the replicas, not replica 0's share (stock),
  for `gradient`, `jacobian`, a Keras optimizer step and a second-order
  gradient whose inner tape alone is under the scope.
- ON_READ sources outside any strategy: refused where the replicas read their
  own components (stock: None or replica 0's share); where the computation
  read the aggregate, the derivative with respect to it (SUM: TensorFlow's
  own, bitwise; MEAN: n times TensorFlow's, which is 1/n of it).
- Keras 3 variables with `unconnected_gradients=ZERO`: zeros of the Keras
  variable's shape and dtype (stock: `AttributeError: 'str' object has no
  attribute '_type_enum'`, or its refusal to watch a Keras variable).
- tfdtape's own refusal inside a tape around the run carries no note about
  operations that communicate across replicas.
"""

import numpy as np
import pytest
import tensorflow as tf

from keras_models import is_keras3
from keras_models import tf_variable
from tfdtape import spanning_tapes
from tfdtape.testing import PATCHED_CONFIGURATIONS

pytestmark = pytest.mark.per_release

KERAS3 = is_keras3(tf.keras)
KERAS_WATCH_REFUSED = "not tf.Tensor or tf.Variable or ExtensionType"
KERAS_ZEROS_FAIL = "'str' object has no attribute '_type_enum'"
ON_READ_SHARES = ("cannot differentiate with respect to .* outside any "
                  "strategy .*took part with different gradients")


def replica_inputs(strategy):
    """Replica r's input: r + 1."""
    return strategy.experimental_distribute_values_from_function(
        lambda context: tf.constant(float(context.replica_id_in_sync_group + 1)))


def make_variable(strategy, kind):
    """A variable of 1.0 made in the strategy's scope: eagerly, inside a
    tf.function, or as a Keras Dense layer's (1, 1) kernel; and a function
    giving the value the replicas multiply by their input."""
    with strategy.scope():
        if kind == "eager":
            variable = tf.Variable(1.0)
        elif kind == "in_tf_function":
            made = []

            @tf.function
            def create():
                if not made:
                    made.append(tf.Variable(1.0))
                return made[0].read_value()

            create()
            variable = made[0]
        else:
            layer = tf.keras.layers.Dense(1, use_bias=False,
                                          kernel_initializer="ones")
            layer.build((None, 1))
            variable = layer.kernel
            return variable, lambda x: layer(tf.reshape(x, (1, 1)))[0, 0]
    return variable, lambda x: x * variable


@pytest.mark.parametrize("kind", ["eager", "in_tf_function", "keras_dense"])
def test_an_explicit_watch_around_a_tf_function_that_runs_the_replicas(
        strategy, configuration, kind):
    if kind == "keras_dense" and not KERAS3:
        pytest.skip("tf.keras is Keras 2 here: its kernel is a tf.Variable")
    w, replica_value = make_variable(strategy, kind)
    inputs = replica_inputs(strategy)

    @tf.function
    def forward():
        return strategy.reduce("SUM", strategy.run(replica_value, args=(inputs,)),
                               axis=None)

    with tf.GradientTape(watch_accessed_variables=False, persistent=True) as tape:
        if kind == "keras_dense" and configuration not in PATCHED_CONFIGURATIONS:
            with pytest.raises(ValueError, match=KERAS_WATCH_REFUSED):
                tape.watch(w)
            return
        tape.watch(w)
        loss = forward()
    assert float(loss) == 10.0  # 1 + 2 + 3 + 4
    gradient = tape.gradient(loss, w)
    jacobian = tape.jacobian(loss, w)
    # Stock watches w through its first component: replica 0's share.
    expected = 10.0 if configuration in PATCHED_CONFIGURATIONS else 1.0
    assert np.asarray(gradient).item() == expected
    assert np.asarray(jacobian).item() == expected
    assert [v is tf_variable(w) for v in tape.watched_variables()] == [True]


def test_an_optimizer_step_on_that_gradient(strategy, configuration):
    w, replica_value = make_variable(strategy, "eager")
    inputs = replica_inputs(strategy)

    @tf.function
    def forward():
        return strategy.reduce("SUM", strategy.run(replica_value, args=(inputs,)),
                               axis=None)

    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(w)
        loss = forward()
    gradient = tape.gradient(loss, w)
    with strategy.scope():
        optimizer = tf.keras.optimizers.SGD(0.125)
    optimizer.apply_gradients([(gradient, w)])
    step = 10.0 if configuration in PATCHED_CONFIGURATIONS else 1.0
    assert [float(c) for c in w.values] == [1.0 - 0.125 * step] * 4


def test_second_order_with_only_the_inner_tape_under_the_scope(
        strategy, configuration):
    """Replica r computes (r + 1) w²: the first derivative's total is
    Σ 2 (r + 1) w = 20 w, the second 20."""
    with strategy.scope():
        w = tf.Variable(1.5)
    inputs = replica_inputs(strategy)

    @tf.function
    def forward():
        return strategy.reduce("SUM", strategy.run(lambda x: x * w * w,
                                                   args=(inputs,)), axis=None)

    with tf.GradientTape(watch_accessed_variables=False) as outer:
        outer.watch(w)
        with strategy.scope():
            with tf.GradientTape() as inner:
                loss = forward()
            if configuration not in PATCHED_CONFIGURATIONS:
                with pytest.raises(ValueError, match="handle is not available"):
                    inner.gradient(loss, w)
                return
            first = inner.gradient(loss, w)
    assert float(first) == 30.0
    assert float(outer.gradient(first, w)) == 20.0


def on_read_variable(strategy, aggregation):
    with strategy.scope():
        return tf.Variable(2.0, trainable=True, aggregation=aggregation,
                           synchronization=tf.VariableSynchronization.ON_READ)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
def test_an_on_read_source_the_replicas_read_is_refused_outside_any_strategy(
        strategy, configuration, traced):
    """Each replica reads its own component: outside the replicas the
    variable has no one derivative (stock: None, or replica 0's share)."""
    s = on_read_variable(strategy, tf.VariableAggregation.SUM)
    inputs = replica_inputs(strategy)

    def total():
        return tf.add_n(strategy.experimental_local_results(
            strategy.run(lambda x: x * s, args=(inputs,))))

    if traced:
        total = tf.function(total)
    with tf.GradientTape() as tape:
        loss = total()
    assert float(loss) == 20.0
    if configuration not in PATCHED_CONFIGURATIONS:
        found = tape.gradient(loss, s)
        assert (found is None) if not traced else float(found) == 1.0
        return
    with pytest.raises(ValueError, match=ON_READ_SHARES) as raised:
        tape.gradient(loss, s)
    assert "strategy.run" in str(raised.value)
    assert spanning_tapes.BACKWARD_NOTE not in str(raised.value)


def test_the_same_refusal_inside_a_tf_function_runs_with_the_gradient(
        strategy, configuration):
    """Traced, whether the shares differ is known only when the gradient is
    computed: an assertion raises then, with the same message."""
    s = on_read_variable(strategy, tf.VariableAggregation.SUM)
    inputs = replica_inputs(strategy)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.add_n(strategy.experimental_local_results(
                strategy.run(lambda x: x * s, args=(inputs,))))
        return tape.gradient(loss, s)

    if configuration not in PATCHED_CONFIGURATIONS:
        assert step() is None
        return
    with pytest.raises(tf.errors.InvalidArgumentError, match=ON_READ_SHARES):
        step()


@pytest.mark.parametrize("aggregation, factor", [
    (tf.VariableAggregation.SUM, 1), (tf.VariableAggregation.MEAN, 4)],
    ids=["sum", "mean"])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
def test_an_on_read_source_read_as_a_whole_outside_any_strategy(
        strategy, configuration, aggregation, factor, traced):
    """`5 * s` reads the aggregate: d/ds is 5. TensorFlow differentiates with
    respect to the first component: 5 for SUM, 5/4 for MEAN."""
    s = on_read_variable(strategy, aggregation)

    def gradient():
        with tf.GradientTape() as tape:
            tape.watch(s)
            loss = s * 5.0
        return tape.gradient(loss, s)

    if traced:
        gradient = tf.function(gradient)
    found = gradient()
    if configuration in PATCHED_CONFIGURATIONS:
        assert float(found) == 5.0
    else:
        assert float(found) == 5.0 / factor


@pytest.mark.parametrize("where", ["no_strategy", "replica"])
@pytest.mark.parametrize("watch", [True, False], ids=["watched", "unwatched"])
def test_keras_variables_get_zeros_for_unconnected_gradients(
        strategy, configuration, where, watch):
    if not KERAS3:
        pytest.skip("tf.keras is Keras 2 here: its variables are tf.Variables")
    if where == "no_strategy":
        variable = tf.keras.Variable(np.ones((2, 3), np.float32))
    else:
        with strategy.scope():
            layer = tf.keras.layers.Dense(3, use_bias=False)
            layer.build((None, 2))
        variable = layer.kernel

    def gradient():
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            if watch:
                tape.watch(variable)
            loss = tf.constant(1.0)
        return tape.gradient(loss, variable,
                             unconnected_gradients=tf.UnconnectedGradients.ZERO)

    if where == "no_strategy":
        run = gradient
    else:
        def run():
            return strategy.experimental_local_results(strategy.run(gradient))
    if configuration not in PATCHED_CONFIGURATIONS and watch:
        with pytest.raises(ValueError, match=KERAS_WATCH_REFUSED):
            run()  # Stock's watch refuses a Keras variable.
        return
    if configuration not in PATCHED_CONFIGURATIONS:
        try:
            found = run()
        except AttributeError as error:  # Keras 3.15, TensorFlow 2.21
            assert KERAS_ZEROS_FAIL in str(error)
            return
        # Newer TensorFlow and Keras (the nightly builds) give the zeros too.
    else:
        found = run()
    for zeros in (found,) if where == "no_strategy" else found:
        assert zeros.dtype == tf.float32
        np.testing.assert_array_equal(zeros.numpy(), np.zeros((2, 3), np.float32))
    if where == "replica":
        assert [z.device for z in found] == [c.device for c in layer.kernel.value.values]


def test_a_refusal_inside_a_tape_around_the_run_has_no_collective_note(
        strategy, configuration):
    """A SyncOnRead source in cross-replica context is refused for what it
    is; the note about operations that communicate across replicas belongs
    to TensorFlow's errors of the backward pass only."""
    s = on_read_variable(strategy, tf.VariableAggregation.SUM)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.add_n(strategy.experimental_local_results(
                strategy.run(lambda: 3.0 * s)))
        with strategy.scope():
            return tape.gradient(loss, s)

    if configuration not in PATCHED_CONFIGURATIONS:
        with pytest.raises(ValueError, match="handle is not available"):
            step()
        return
    with pytest.raises(ValueError, match="in cross-replica context") as raised:
        step()
    assert "whose replicas hold different values" in str(raised.value)
    assert "communicate across replicas" not in str(raised.value)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
def test_a_per_replica_target_is_the_sum_of_its_replicas(
        strategy, configuration, traced):
    """Found by the generated programs: `tape.gradient(per_replica, w)`, as
    of several targets, differentiates their sum (stock refuses a PerReplica
    target: eagerly with a TypeError, traced with a ValueError)."""
    w, replica_value = make_variable(strategy, "eager")
    inputs = replica_inputs(strategy)

    def step():
        with tf.GradientTape() as tape:
            per_replica = strategy.run(lambda x: replica_value(x) ** 2, args=(inputs,))
        return tape.gradient(per_replica, w)

    if traced:
        step = tf.function(step)
    if configuration not in PATCHED_CONFIGURATIONS:
        with pytest.raises((TypeError, ValueError), match="PerReplica|Argument `target`"):
            step()
        return
    assert float(step()) == 60.0  # Σ 2 (r + 1)² w


def test_an_error_of_another_cause_in_the_backward_pass_has_no_collective_note(
        strategy, configuration):
    """Found by the generated programs: the note about operations that
    communicate across replicas went onto every error of such a tape's
    backward pass."""
    with strategy.scope():
        w = tf.Variable(1.0)

    @tf.custom_gradient
    def fails_backward(x):
        def backward(upstream):
            raise ValueError("the user's backward failed")
        return tf.identity(x), backward

    with strategy.scope():
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", strategy.run(lambda: fails_backward(w * 2.0)),
                                   axis=None)
        if configuration not in PATCHED_CONFIGURATIONS:
            with pytest.raises(ValueError, match="handle is not available"):
                tape.gradient(loss, w)
            return
        with pytest.raises(ValueError, match="the user's backward failed") as raised:
            tape.gradient(loss, w)
    assert "communicate across replicas" not in str(raised.value)


@pytest.mark.parametrize("also_outside", [False, True], ids=["inside", "also_outside"])
def test_a_watch_inside_a_tf_function_passed_to_strategy_run(
        strategy, configuration, also_outside):
    """Found by the generated programs and the review: the replicas of a
    tf.function passed to strategy.run run in threads the tape does not
    record, where TensorFlow's watch does nothing (None); and the watch runs
    while the function traces only, so the steps after the first would get
    None. tfdtape refuses it, unless the tape watches the variable anyway."""
    w, replica_value = make_variable(strategy, "eager")
    inputs = replica_inputs(strategy)
    tapes = []

    @tf.function
    def replica_fn(x):
        tapes[-1].watch(w)
        return replica_value(x)

    found = []
    for _ in range(3):
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tapes.append(tape)
            if also_outside:
                tape.watch(w)
            if configuration in PATCHED_CONFIGURATIONS and not also_outside:
                with pytest.raises(ValueError, match="cannot watch .* inside this "
                                   "tf.function .*later calls would give None"):
                    strategy.run(replica_fn, args=(inputs,))
                return
            loss = tf.add_n(strategy.experimental_local_results(
                strategy.run(replica_fn, args=(inputs,)))) + 3.0 * w
        gradient = tape.gradient(loss, w)
        found.append(None if gradient is None else float(gradient))
    if configuration in PATCHED_CONFIGURATIONS:
        assert found == [13.0] * 3  # 1 + 2 + 3 + 4, and 3
    else:  # Stock watches w outside through its first component alone.
        assert found == ([4.0] * 3 if also_outside else [None] * 3)


def test_a_cross_replica_watch_lists_the_variable_once(strategy, configuration):
    """Found by the review: the tape watches every component, and listed
    them; applying gradients to that list updated each copy with its own
    share, and the copies drifted apart."""
    with strategy.scope():
        w = tf.Variable(1.0)
    inputs = replica_inputs(strategy)
    with strategy.scope():
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            if configuration not in PATCHED_CONFIGURATIONS:
                with pytest.raises(ValueError, match="handle is not available"):
                    tape.watch(w)
                return
            tape.watch(w)
            loss = strategy.reduce("SUM", strategy.run(lambda x: w * x, args=(inputs,)),
                                   axis=None)
        watched = tape.watched_variables()
        assert [v is w for v in watched] == [True]
        for gradient, variable in zip(tape.gradient(loss, watched), watched):
            variable.assign_sub(gradient)
    assert [float(c) for c in w.values] == [-9.0] * 4


@pytest.mark.parametrize("aggregation", [tf.VariableAggregation.SUM,
                                         tf.VariableAggregation.MEAN], ids=["sum", "mean"])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
def test_a_nan_gradient_of_an_on_read_aggregate_is_nan(
        strategy, configuration, aggregation, traced):
    """Found by the review: NaN gradients, equal on every component, were
    taken for shares that differ."""
    s = on_read_variable(strategy, aggregation)

    def gradient():
        with tf.GradientTape() as tape:
            tape.watch(s)
            loss = s * tf.math.log(-s)
        return tape.gradient(loss, s)

    if traced:
        gradient = tf.function(gradient)
    assert np.isnan(float(gradient()))


def test_an_all_reduce_outside_any_strategy_is_differentiated(strategy, configuration):
    """Found by the review: with no scope, differentiating the all-reduce
    failed with 'Mismatching tf.distribute.Strategy' (stock: a silent None).
    The all-reduce is now differentiated over every replica: loss = 4 * 4 *
    3w, d/dw = 48."""
    with strategy.scope():
        w = tf.Variable(2.0)
    with tf.GradientTape() as tape:
        loss = strategy.reduce("SUM", strategy.run(
            lambda: tf.distribute.get_replica_context().all_reduce("SUM", w * 3.0)),
            axis=None)
    if configuration not in PATCHED_CONFIGURATIONS:
        assert tape.gradient(loss, w) is None
        return
    assert float(loss) == 96.0
    assert float(tape.gradient(loss, w)) == 48.0
