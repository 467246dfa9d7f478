"""Tapes whose recording crosses the replica boundary, and values of other
strategies.

- A tape recording in the thread that calls `strategy.run` (outside replica
  context) records what every replica computes, eagerly and while a
  `tf.function` is traced; its gradient outside replica context is the total
  derivative over the replicas. Stock TensorFlow raises its handle error in
  cross-replica context, and with no strategy returns None or replica 0's
  share alone. Not recorded: paused tapes, tapes of other threads, tapes
  opened inside replica context; a `tf.function` passed to `strategy.run`
  stays one recorded call.
- `tape.watch(per_replica_value)` watches each component, as stock does.
- A variable of another strategy with no component for the current replica
  is refused with both strategies named, nothing watched, nothing traced.
- `jacobian` / `batch_jacobian` with distributed sources in cross-replica
  context go through tfdtape's `gradient` and give the total derivative.
"""

import contextlib
import importlib
import threading

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python import pywrap_tfe

import tfdtape
from assertions import assert_same_objects
from conftest import DEVICES
from keras_models import tf_variable
from tfdtape import spanning_tapes
from tfdtape import testing
from tfdtape.testing import PATCHED_CONFIGURATIONS

pytestmark = pytest.mark.per_release

HANDLE_UNAVAILABLE = ("DistributedVariable.handle is not available outside "
                      "the replica context")


def reduced_square_loss(strategy, v, traced):
    """Opens a tape in cross-replica context, runs strategy.run (each replica
    reads v) and reduces; returns (tape, loss)."""
    def replicas():
        return strategy.run(lambda: v * v)

    if traced:
        replicas = tf.function(replicas)
    with strategy.scope():
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", replicas(), axis=None)
    return tape, loss


def test_a_tape_around_an_eager_strategy_run_records_the_replicas(
        strategy, configuration):
    with strategy.scope():
        v = tf.Variable(3.0, name="shared")
    tape, loss = reduced_square_loss(strategy, v, traced=False)
    assert float(loss) == 36.0
    with strategy.scope():
        if configuration not in PATCHED_CONFIGURATIONS:
            with pytest.raises(ValueError, match=HANDLE_UNAVAILABLE):
                tape.gradient(loss, v)
            return
        gradient = tape.gradient(loss, v)
    assert float(gradient) == 24.0  # 4 replicas, each d(v*v)/dv = 6
    assert spanning_tapes.spanned_runs(tape) == 1
    # Each replica watched v through its own component's handle; listed once.
    assert_same_objects(tape.watched_variables(), [v])


def test_a_tensor_computed_from_v_before_the_run(strategy, configuration):
    """The replicas never read v: they use a tensor the tape computed from
    it before the run; both it and v get their total derivative."""
    with strategy.scope():
        v = tf.Variable(3.0)
        with tf.GradientTape(persistent=True) as tape:
            w = v * 2.0
            loss = strategy.reduce("SUM", strategy.run(lambda: w * 3.0), axis=None)
            loss += v
        assert float(loss) == 75.0  # 4 replicas x 18, plus 3
        if configuration not in PATCHED_CONFIGURATIONS:
            with pytest.raises(ValueError, match=HANDLE_UNAVAILABLE):
                tape.gradient(loss, v)
            assert tape.gradient(loss, w) is None  # the replicas went unrecorded
            return
        assert float(tape.gradient(loss, v)) == 25.0  # 4 x 2 x 3, plus 1
        assert float(tape.gradient(loss, w)) == 12.0


def test_a_plain_variable_read_by_every_replica(strategy, configuration):
    """A variable created outside the scope is shared by the replicas: its
    gradient sums their uses."""
    shared = tf.Variable(3.0, name="outside")
    with strategy.scope():
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", strategy.run(lambda: shared * 2.0),
                                   axis=None)
        gradient = tape.gradient(loss, shared)
    if configuration not in PATCHED_CONFIGURATIONS:
        assert gradient is None
        return
    assert float(gradient) == 8.0


@pytest.mark.parametrize("configuration", PATCHED_CONFIGURATIONS, indirect=True)
def test_a_strategy_run_in_another_thread_is_not_recorded(strategy, configuration):
    with strategy.scope():
        v = tf.Variable(3.0)
    other = threading.Thread(target=lambda: strategy.run(lambda: v * 2.0))
    with strategy.scope():
        with tf.GradientTape() as tape:
            loss = tf.add_n([c * 2.0 for c in v.values])
            other.start()
            other.join()
        assert float(tape.gradient(loss, v)) == 8.0
    assert spanning_tapes.spanned_runs(tape) == 0


@pytest.mark.parametrize("configuration", PATCHED_CONFIGURATIONS, indirect=True)
def test_recording_survives_a_reload(strategy, configuration):
    with strategy.scope():
        v = tf.Variable(3.0)
        with tf.GradientTape() as tape:
            importlib.reload(spanning_tapes)  # while the tape records
            loss = strategy.reduce("SUM", strategy.run(lambda: v * v), axis=None)
        assert float(tape.gradient(loss, v)) == 24.0


def test_keras_variables_read_in_an_eager_strategy_run(strategy, configuration):
    with strategy.scope():
        layer = tf.keras.layers.Dense(1, name="head",
                                      kernel_initializer="ones")
        layer.build((None, 2))
        with tf.GradientTape() as tape:
            outputs = strategy.run(lambda: layer(tf.ones((1, 2))))
            loss = strategy.reduce("SUM", outputs, axis=None)
        if configuration not in PATCHED_CONFIGURATIONS:
            with pytest.raises((ValueError, AttributeError)):
                tape.gradient(loss, layer.trainable_variables)
            return
        kernel, bias = tape.gradient(loss, layer.trainable_variables)
    np.testing.assert_array_equal(kernel.numpy(), [[4.0], [4.0]])
    np.testing.assert_array_equal(bias.numpy(), [4.0])
    assert_same_objects(
        sorted(tape.watched_variables(), key=id),
        sorted([tf_variable(layer.kernel), tf_variable(layer.bias)], key=id))


def test_traced_strategy_run_under_a_cross_replica_tape(strategy, configuration):
    """A tape outside the tf.function records its call as one operation."""
    with strategy.scope():
        v = tf.Variable(3.0)
    tape, loss = reduced_square_loss(strategy, v, traced=True)
    with strategy.scope():
        if configuration not in PATCHED_CONFIGURATIONS:
            with pytest.raises(ValueError, match=HANDLE_UNAVAILABLE):
                tape.gradient(loss, v)
            return
        gradient = tape.gradient(loss, v)
    assert float(gradient) == 24.0  # 4 replicas, each d(v*v)/dv = 6
    assert spanning_tapes.spanned_runs(tape) == 0


def test_a_tape_inside_the_tf_function_that_calls_strategy_run(
        strategy, configuration):
    """Traced too, the replicas run in threads of their own; the tape opened
    in the function body records them."""
    with strategy.scope():
        v = tf.Variable(2.0, name="traced")

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            per_replica = strategy.run(lambda: v * 3.0)
            loss = strategy.reduce("SUM", per_replica, axis=None) + v * 1.0
        return tape.gradient(loss, v)

    with strategy.scope():
        if configuration not in PATCHED_CONFIGURATIONS:
            with pytest.raises(ValueError, match=HANDLE_UNAVAILABLE):
                step()
            return
        assert float(step()) == 13.0  # 4 replicas x 3, plus 1


@pytest.mark.parametrize("direct_term", [False, True])
def test_a_tf_function_step_with_no_scope_around_it(strategy, configuration,
                                                    direct_term):
    """With no strategy around the tape, TensorFlow lets v stand for its
    first component: stock gives None (only replicas read v) or the direct
    term alone (replica 0's share is missing too); tfdtape the total."""
    with strategy.scope():
        v = tf.Variable(2.0, name="no_scope")

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            per_replica = strategy.run(lambda: v * 3.0)
            loss = strategy.reduce("SUM", per_replica, axis=None)
            if direct_term:
                loss += v
        return tape.gradient(loss, v)

    gradient = step()
    if configuration not in PATCHED_CONFIGURATIONS:
        if direct_term:
            assert float(gradient) == 1.0
        else:
            assert gradient is None
        return
    assert float(gradient) == (13.0 if direct_term else 12.0)


def test_an_eager_step_with_no_scope_around_it(strategy, configuration):
    with strategy.scope():
        v = tf.Variable(2.0)
    with tf.GradientTape() as tape:
        loss = strategy.reduce("SUM", strategy.run(lambda: v * v), axis=None)
    gradient = tape.gradient(loss, v)
    if configuration not in PATCHED_CONFIGURATIONS:
        assert gradient is None
        return
    assert float(gradient) == 16.0


@pytest.mark.parametrize("flow", ["cond", "loop"])
@pytest.mark.parametrize("scoped", [False, True], ids=["no_scope", "scope"])
def test_strategy_run_in_control_flow_under_the_tape(strategy, configuration,
                                                     flow, scoped):
    """A strategy.run traced in a tf.cond branch or a tf.range loop body of
    the tf.function the tape records is recorded as if traced inline."""
    with strategy.scope():
        v = tf.Variable(2.0)

    def run():
        return strategy.reduce("SUM", strategy.run(lambda: v * 3.0), axis=None)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            if flow == "cond":
                loss = tf.cond(tf.constant(True), run, lambda: v * 10.0)
            else:
                loss = tf.constant(0.0)
                for _ in tf.range(2):
                    loss += run()
        return tape.gradient(loss, v)

    with strategy.scope() if scoped else contextlib.nullcontext():
        if configuration not in PATCHED_CONFIGURATIONS:
            if scoped:
                with pytest.raises(ValueError, match=HANDLE_UNAVAILABLE):
                    step()
            else:
                gradient = step()
                assert gradient is None or float(gradient) < 12.0  # partial
            return
        gradient = step()
    assert float(gradient) == (12.0 if flow == "cond" else 24.0)


def test_an_eager_tape_around_a_tf_function_that_runs_the_replicas(
        strategy, configuration):
    """No scope: the tape records the function's call; outside any strategy
    TensorFlow gives replica 0's share, tfdtape the total."""
    with strategy.scope():
        v = tf.Variable(2.0)
    replicas = tf.function(
        lambda: strategy.reduce("SUM", strategy.run(lambda: v * v), axis=None))
    with tf.GradientTape() as tape:
        loss = replicas()
    gradient = tape.gradient(loss, v)
    if configuration not in PATCHED_CONFIGURATIONS:
        assert float(gradient) == 4.0  # replica 0's share
        return
    assert float(gradient) == 16.0


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
def test_an_all_reduce_inside_the_replicas_is_differentiated_over_them(
        strategy, configuration, traced):
    """ReplicaContext.all_reduce inside the replicas of a tape around the
    run: loss = 4 replicas * (4 * 3v), d/dv = 48 (stock: the handle error)."""
    with strategy.scope():
        v = tf.Variable(2.0)

    def step():
        with tf.GradientTape() as tape:
            per_replica = strategy.run(lambda: tf.distribute.get_replica_context()
                                       .all_reduce("SUM", v * 3.0))
            loss = strategy.reduce("SUM", per_replica, axis=None)
        return tape.gradient(loss, v)

    if traced:
        step = tf.function(step)
    with strategy.scope():
        if configuration not in PATCHED_CONFIGURATIONS:
            with pytest.raises(ValueError, match=HANDLE_UNAVAILABLE):
                step()
            return
        assert float(step()) == 48.0


def test_a_keras_step_with_the_tape_inside_its_tf_function(
        strategy, configuration):
    with strategy.scope():
        layer = tf.keras.layers.Dense(1, name="head", kernel_initializer="ones")
        layer.build((None, 2))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            outputs = strategy.run(lambda: layer(tf.ones((1, 2))))
            loss = strategy.reduce("SUM", outputs, axis=None)
        return tape.gradient(loss, layer.trainable_variables)

    with strategy.scope():
        if configuration not in PATCHED_CONFIGURATIONS:
            with pytest.raises(ValueError, match=HANDLE_UNAVAILABLE):
                step()
            return
        kernel, bias = step()
    np.testing.assert_array_equal(kernel.numpy(), [[4.0], [4.0]])
    np.testing.assert_array_equal(bias.numpy(), [4.0])


@pytest.mark.parametrize("configuration", PATCHED_CONFIGURATIONS, indirect=True)
def test_strategy_run_in_an_inner_tf_function_is_one_recorded_call(
        strategy, configuration):
    with strategy.scope():
        v = tf.Variable(2.0)
    replicas = tf.function(lambda: strategy.run(lambda: v * 3.0))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", replicas(), axis=None) + v * 1.0
        return tape.gradient(loss, v)

    with strategy.scope():
        assert float(step()) == 13.0  # 4 replicas x 3, plus 1


@pytest.mark.parametrize("configuration", PATCHED_CONFIGURATIONS, indirect=True)
def test_a_tf_function_passed_to_strategy_run_is_one_recorded_call(
        strategy, configuration):
    with strategy.scope():
        v = tf.Variable(3.0)
        with tf.GradientTape() as tape:
            per_replica = strategy.run(tf.function(lambda: v * v))
            loss = strategy.reduce("SUM", per_replica, axis=None)
        assert float(tape.gradient(loss, v)) == 24.0
    assert spanning_tapes.spanned_runs(tape) == 0


@pytest.mark.parametrize("configuration", PATCHED_CONFIGURATIONS, indirect=True)
def test_strategy_run_outside_the_recording_is_not_recorded(strategy, configuration):
    """A run while the tape is paused, before a reset() or after the tape
    closed is not on the tape."""
    with strategy.scope():
        v = tf.Variable(3.0)
        unused = tf.Variable(1.0)
        with tf.GradientTape(persistent=True) as tape:
            strategy.run(lambda: unused * 2.0)
            tape.reset()
            with tape.stop_recording():
                paused = strategy.reduce(
                    "SUM", strategy.run(lambda: v * 5.0), axis=None)
            loss = v * v + paused
        strategy.run(lambda: v * 2.0)
        assert float(tape.gradient(loss, v)) == 6.0  # v * v alone, on one device
        assert tape.gradient(loss, unused) is None
    assert spanning_tapes.spanned_runs(tape) == 0


@pytest.mark.parametrize("configuration", PATCHED_CONFIGURATIONS, indirect=True)
def test_nothing_is_propagated_while_the_thread_does_not_record(
        strategy, configuration):
    """tf.init_scope() stops every tape of the thread; a strategy.run there
    is recorded by none."""
    with strategy.scope():
        v = tf.Variable(3.0)
        with tf.GradientTape(persistent=True) as tape:
            with tf.init_scope():
                paused = strategy.reduce("SUM", strategy.run(lambda: v * v),
                                         axis=None)
            loss = strategy.reduce("SUM", strategy.run(lambda: v * 2.0), axis=None)
        assert tape.gradient(paused, v) is None
        assert float(tape.gradient(loss, v)) == 8.0
    assert spanning_tapes.spanned_runs(tape) == 1


@pytest.mark.parametrize("configuration", PATCHED_CONFIGURATIONS, indirect=True)
def test_persistent_nested_and_second_order(strategy, configuration):
    with strategy.scope():
        v = tf.Variable(3.0)
        with tf.GradientTape() as outer:
            with tf.GradientTape(persistent=True) as inner:
                loss = strategy.reduce(
                    "SUM", strategy.run(lambda: v * v * v), axis=None)
            first = inner.gradient(loss, v)  # 4 x 3 v^2
            again = inner.gradient(loss, v)
        second = outer.gradient(first, v)  # 4 x 6 v
    assert float(first) == float(again) == 108.0
    assert float(second) == 72.0


@pytest.mark.parametrize("configuration", PATCHED_CONFIGURATIONS, indirect=True)
def test_a_replica_function_that_raises_leaves_no_tape_behind(
        strategy, configuration):
    tape_set_empty_after = []

    def replica():
        if tf.distribute.get_replica_context().replica_id_in_sync_group == 1:
            raise KeyError("replica 1 fails")
        return v * 2.0

    with strategy.scope():
        v = tf.Variable(3.0)
        with tf.GradientTape():
            with pytest.raises(KeyError, match="replica 1 fails"):
                strategy.run(replica)
    assert pywrap_tfe.TFE_Py_TapeSetIsEmpty()
    # What each replica thread runs, raising in a thread of its own: the
    # thread's tape set is empty again afterwards.
    with tf.GradientTape() as tape:
        recorded = spanning_tapes._recorded_by(
            [tape], strategy, lambda: {}["missing"], spanning_tapes._SpannedRun())

        def thread_body():
            with pytest.raises(KeyError):
                recorded()
            tape_set_empty_after.append(pywrap_tfe.TFE_Py_TapeSetIsEmpty())

        thread = threading.Thread(target=thread_body)
        thread.start()
        thread.join()
    assert tape_set_empty_after == [True]


@pytest.mark.parametrize("configuration", PATCHED_CONFIGURATIONS, indirect=True)
def test_tape_inside_strategy_run_is_unaffected(strategy, configuration):
    with strategy.scope():
        v = tf.Variable(3.0)

    def step():
        with tf.GradientTape() as tape:
            loss = v * v
        return tape.gradient(loss, v)

    with strategy.scope(), tf.GradientTape():
        gradients = strategy.run(step)
    assert [float(g) for g in strategy.experimental_local_results(gradients)] == [
        6.0] * 4


@pytest.mark.parametrize("where", ["no strategy", "cross-replica"])
def test_watch_a_per_replica_value_as_stock(strategy, configuration, where):
    per_replica = strategy.run(lambda: tf.constant(2.0))
    context = (strategy.scope() if where == "cross-replica"
               else contextlib.nullcontext())
    with context:
        with tf.GradientTape() as tape:
            tape.watch(per_replica)
            loss = tf.add_n([c * x * x for c, x in
                             zip([1.0, 2.0, 3.0, 4.0], per_replica.values)])
        gradients = tape.gradient(loss, list(per_replica.values))
    assert [float(g) for g in gradients] == [4.0, 8.0, 12.0, 16.0]


def test_watch_a_variable_of_a_smaller_strategy(strategy, configuration):
    small = tf.distribute.MirroredStrategy(DEVICES[:2])
    with small.scope():
        w = tf.Variable(3.0, name="small_w")
    outcomes = {}

    def step():
        context = tf.distribute.get_replica_context()
        replica_id = int(tf.get_static_value(context.replica_id_in_sync_group))
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            try:
                tape.watch(w)
                outcomes[replica_id] = ("watched", tape.watched_variables())
            except Exception as error:
                outcomes[replica_id] = (error, tape.watched_variables())

    patched = configuration in PATCHED_CONFIGURATIONS
    with tfdtape.trace() if patched else contextlib.nullcontext() as trace:
        strategy.run(step)
    assert sorted(outcomes) == [0, 1, 2, 3]
    for replica_id in (0, 1):  # w has components there: watched as stock
        assert outcomes[replica_id][0] == "watched"
        assert_same_objects(outcomes[replica_id][1], [w])
    for replica_id in (2, 3):
        error, watched = outcomes[replica_id]
        assert len(watched) == 0
        if configuration in PATCHED_CONFIGURATIONS:
            assert isinstance(error, tfdtape.NotWatchableError)
            text = str(error)
            assert text.startswith("tfdtape: variable 'small_w:0' belongs to "
                                   "another strategy (tf.GradientTape.watch)")
            assert "a MirroredStrategy with 4 replicas" in text
            assert ("a MirroredVariable of a MirroredStrategy with 2 replicas, "
                    f"which has 2 local components and none for replica "
                    f"{replica_id}") in text
        else:
            assert isinstance(error, IndexError)
    if patched:  # Only the watches that happened, in replicas 0 and 1.
        watches = [e for e in trace.events if e.kind == "watch"]
        assert sorted(e.replica_id for e in watches) == [0, 1]


@pytest.mark.parametrize("pfor", [True, False], ids=["pfor", "while_loop"])
def test_jacobian_with_a_distributed_source(strategy, configuration, pfor):
    with strategy.scope():
        v = tf.Variable([1.0, 2.0])
        with tf.GradientTape(persistent=True) as tape:
            # target[j] = sum_i (i + 1) * component_i[j]**2
            target = tf.add_n([(i + 1.0) * c * c for i, c in enumerate(v.values)])
        if configuration not in PATCHED_CONFIGURATIONS:
            with pytest.raises(ValueError):
                tape.jacobian(target, v, experimental_use_pfor=pfor)
            return
        jacobian = tape.jacobian(target, v, experimental_use_pfor=pfor)
    # d target[j] / d v[k] = sum_i (i + 1) * 2 * v[j] * [j == k] = 20 v[j] [j == k]
    np.testing.assert_array_equal(jacobian.numpy(), [[20.0, 0.0], [0.0, 40.0]])


@pytest.mark.parametrize("pfor", [True, False], ids=["pfor", "while_loop"])
def test_batch_jacobian_with_a_distributed_source(strategy, configuration, pfor):
    with strategy.scope():
        v = tf.Variable([[1.0, 2.0], [3.0, 4.0]])  # batch of 2, 2 features
        with tf.GradientTape(persistent=True) as tape:
            target = tf.add_n([(i + 1.0) * c * c for i, c in enumerate(v.values)])
        if configuration not in PATCHED_CONFIGURATIONS:
            with pytest.raises(ValueError):
                tape.batch_jacobian(target, v, experimental_use_pfor=pfor)
            return
        jacobian = tape.batch_jacobian(target, v, experimental_use_pfor=pfor)
    expected = np.zeros((2, 2, 2), np.float32)
    for b in range(2):
        for j in range(2):
            expected[b, j, j] = 20.0 * v.values[0].numpy()[b, j]
    np.testing.assert_array_equal(jacobian.numpy(), expected)


def test_keras_variable_unwrap_keeps_tf_variable_identity(strategy):
    with strategy.scope():
        layer = tf.keras.layers.Dense(1)
        layer.build((None, 2))
    assert tf_variable(layer.kernel) is tfdtape.resolve(layer.kernel)[0]


def _outside_any_strategy_results(strategy):
    """Gradients outside any strategy that TensorFlow gets right: an ON_READ
    source, a -0.0 gradient, a sparse one and an unconnected one, with
    unconnected_gradients=ZERO; as bytes and types."""
    with strategy.scope():
        on_read = tf.Variable(2.0, synchronization=tf.VariableSynchronization.ON_READ,
                              aggregation=tf.VariableAggregation.SUM, trainable=True)
        table = tf.Variable([[1.0, 2.0], [3.0, 4.0]])
        v = tf.Variable(3.0)
        unused = tf.Variable(1.0)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(on_read)
        loss = on_read * 5.0 + v * tf.constant(-0.0) + tf.reduce_sum(
            tf.gather(table, [1]))
    found = []
    for source in (on_read, v, table, unused):
        gradient = tape.gradient(loss, source,
                                 unconnected_gradients=tf.UnconnectedGradients.ZERO)
        dense = tf.convert_to_tensor(gradient)
        found.append((type(gradient).__name__, dense.numpy().tobytes()))
    found.append(type(tape.gradient(loss, on_read)).__name__)
    return found


@pytest.mark.parametrize("name", ["tfdtape", "tfdtape_alone", "pre_seed"])
def test_outside_any_strategy_tensorflows_answers_stay_bitwise(strategy, name):
    with testing.stock():
        expected = _outside_any_strategy_results(strategy)
    with testing.configuration(name):
        found = _outside_any_strategy_results(strategy)
    assert found == expected
    assert found[2][0] == "IndexedSlices"  # stays sparse
    assert found[1][1] == tf.constant(-0.0).numpy().tobytes()


def test_an_explicit_watch_outside_any_strategy_covers_every_replica(
        strategy, configuration):
    """watch_accessed_variables=False and tape.watch(v) before the run: each
    replica's share is on the tape."""
    with strategy.scope():
        v = tf.Variable(3.0)
    features = strategy.experimental_distribute_values_from_function(
        lambda context: tf.constant(float(context.replica_id_in_sync_group + 1)))
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(v)
        loss = strategy.reduce("SUM", strategy.run(lambda x: v * x, args=(features,)),
                               axis=None)
    gradient = tape.gradient(loss, v)
    if configuration not in PATCHED_CONFIGURATIONS:
        assert gradient is None
        return
    assert float(gradient) == 10.0  # 1 + 2 + 3 + 4


def _keras_gradients_outside_any_strategy(strategy):
    """A Keras model built under the strategy, differentiated by a tf.function
    step called outside any scope (no strategy.run): as bytes."""
    with strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.Input((3,)),
            tf.keras.layers.Dense(4, activation="tanh",
                                  kernel_initializer="ones"),
            tf.keras.layers.Dense(1, kernel_initializer="ones")])

    @tf.function
    def step(features):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(features) ** 2)
        return tape.gradient(loss, model.trainable_variables)

    gradients = step(tf.constant([[0.1, -0.2, 0.3], [0.5, 0.0, -0.4]]))
    return [tf.convert_to_tensor(g).numpy().tobytes() for g in gradients]


@pytest.mark.parametrize("name", ["tfdtape", "tfdtape_alone", "pre_seed"])
def test_a_keras_model_outside_any_strategy_is_bitwise_stock(strategy, name):
    """Only the first component takes part: TensorFlow's own gradients."""
    with testing.stock():
        expected = _keras_gradients_outside_any_strategy(strategy)
    with testing.configuration(name):
        found = _keras_gradients_outside_any_strategy(strategy)
    assert found == expected
