"""Tapes whose recording crosses the replica boundary, and values of other
strategies.

- A tape opened in cross-replica context around an eager `strategy.run`
  records nothing the replica threads compute: tfdtape refuses the gradient
  naming strategy.run instead of returning None (stock TensorFlow raises its
  handle error). The same holds for a tape opened inside the `tf.function`
  that calls `strategy.run` (traced replicas run in threads too). A tape
  opened outside the `tf.function` records its call, and the gradient is the
  total derivative.
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

import tfdtape
from assertions import assert_same_objects
from conftest import DEVICES
from keras_models import tf_variable
from tfdtape import unrecorded_runs
from tfdtape.testing import PATCHED_CONFIGURATIONS

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


def test_eager_strategy_run_under_a_cross_replica_tape_is_refused(
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
        with pytest.raises(ValueError) as raised:
            tape.gradient(loss, v)
    text = str(raised.value)
    assert text.startswith("tfdtape: cannot take a cross-replica gradient "
                           "through an eager strategy.run "
                           "(tf.GradientTape.gradient)")
    assert "everything between 'shared:0' and the target" in text
    assert f"in TensorFlow {tf.__version__}." in text
    assert "take the gradient inside the function you pass to strategy.run" in text


def test_a_tensor_computed_from_v_used_by_an_eager_run_is_refused(
        strategy, configuration):
    """The replicas never read v: they use a tensor the tape computed from
    it, and what they compute with it is still not on the tape."""
    with strategy.scope():
        v = tf.Variable(3.0)
        with tf.GradientTape() as tape:
            w = v * 2.0
            loss = strategy.reduce("SUM", strategy.run(lambda: w * 3.0), axis=None)
            loss += v  # partial: only this term would be on the tape
        assert float(loss) == 75.0  # 4 replicas x 18, plus 3
        if configuration not in PATCHED_CONFIGURATIONS:
            with pytest.raises(ValueError, match=HANDLE_UNAVAILABLE):
                tape.gradient(loss, v)
            return
        with pytest.raises(ValueError, match="through an eager strategy.run"):
            tape.gradient(loss, v)


@pytest.mark.parametrize("configuration", PATCHED_CONFIGURATIONS, indirect=True)
def test_a_strategy_run_in_another_thread_is_not_blamed(strategy, configuration):
    with strategy.scope():
        v = tf.Variable(3.0)
    other = threading.Thread(target=lambda: strategy.run(lambda: v * 2.0))
    with strategy.scope():
        with tf.GradientTape() as tape:
            loss = tf.add_n([c * 2.0 for c in v.values])
            other.start()
            other.join()
        assert float(tape.gradient(loss, v)) == 8.0


@pytest.mark.parametrize("configuration", PATCHED_CONFIGURATIONS, indirect=True)
def test_refusal_survives_a_reload(strategy, configuration):
    importlib.reload(unrecorded_runs)
    test_eager_strategy_run_under_a_cross_replica_tape_is_refused(
        strategy, configuration)


def test_keras_variables_read_in_eager_strategy_run_are_refused(strategy):
    with strategy.scope():
        layer = tf.keras.layers.Dense(1, name="head")
        layer.build((None, 2))
        with tf.GradientTape() as tape:
            outputs = strategy.run(lambda: layer(tf.ones((1, 2))))
            loss = strategy.reduce("SUM", outputs, axis=None)
        with pytest.raises(ValueError) as raised:
            tape.gradient(loss, layer.trainable_variables)
    # Keras 3 names the variable by its path; Keras 2's is a tf.Variable.
    name = (layer.kernel.name if isinstance(layer.kernel, tf.Variable)
            else "head/kernel")
    assert f"everything between {name!r} and the target" in str(raised.value)


def test_traced_strategy_run_under_a_cross_replica_tape(strategy, configuration):
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


def test_a_tape_inside_the_tf_function_that_calls_strategy_run_is_refused(
        strategy, configuration):
    """Traced too, the replicas run in threads of their own: a tape opened
    in the function body records none of their work (here the gradient
    would silently be 1.0, the direct term alone, instead of 13.0)."""
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
        with pytest.raises(ValueError) as raised:
            step()
    text = str(raised.value)  # AutoGraph puts "in user code:" and a frame first
    assert ("tfdtape: cannot take a cross-replica gradient through a "
            "strategy.run inside the tf.function the tape was opened in "
            "(tf.GradientTape.gradient)") in text
    assert "open the tape outside it" in text


def test_a_keras_step_with_the_tape_inside_its_tf_function_is_refused(
        strategy, configuration):
    with strategy.scope():
        layer = tf.keras.layers.Dense(1, name="head")
        layer.build((None, 2))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            outputs = strategy.run(lambda: layer(tf.ones((1, 2))))
            loss = strategy.reduce("SUM", outputs, axis=None)
        return tape.gradient(loss, layer.trainable_variables)

    with strategy.scope():
        with pytest.raises(ValueError) as raised:
            step()
    if configuration not in PATCHED_CONFIGURATIONS:
        assert HANDLE_UNAVAILABLE in str(raised.value)
        return
    assert ("tfdtape: cannot take a cross-replica gradient through a "
            "strategy.run inside the tf.function the tape was opened in") in str(
                raised.value)


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
def test_strategy_run_outside_the_recording_is_not_blamed(strategy, configuration):
    """Reads by strategy.run after the tape stopped recording, or before a
    reset(), are not the tape's business."""
    with strategy.scope():
        v = tf.Variable(3.0)
        unused = tf.Variable(1.0)
        with tf.GradientTape(persistent=True) as tape:
            strategy.run(lambda: unused * 2.0)
            tape.reset()
            loss = v * v
        strategy.run(lambda: v * 2.0)
        assert float(tape.gradient(loss, v)) == 6.0
        assert tape.gradient(loss, unused) is None


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
            except Exception as error:  # pylint: disable=broad-except
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
