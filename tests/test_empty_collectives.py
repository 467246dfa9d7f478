"""Tensors of no elements through TensorFlow's collective launcher
(tfdtape.empty_collectives; issue 51), on this process's 4 CPUs with a
MirroredStrategy reducing with TensorFlow's collectives (CollectiveAllReduce,
what MultiWorkerMirroredStrategy uses and MirroredStrategy chooses on CPUs
in 2.21; 2.12 reduces to one device unless asked). Stock TensorFlow 2.21
ends the process with SIGSEGV on them (the control, in a process of its
own); with tfdtape each gives NumPy's result, on the device TensorFlow gives
a tensor with elements."""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute import collective_util
from tensorflow.python.distribute import cross_device_ops
from tensorflow.python.distribute import cross_device_utils

import releases
from conftest import DEVICES
from tfdtape import testing

pytestmark = pytest.mark.per_release

CALLS = ("ReplicaContext.all_reduce", "ReplicaContext.all_gather", "strategy.gather",
         "strategy.reduce")
REPLICAS = 4
GROUP_KEYS = 900
"""Where the collective strategy's group keys start: apart from the
session's strategy's (from 1), whose groups of the same devices they would
join otherwise."""


@pytest.fixture(scope="module")
def collective_strategy():
    """MirroredStrategy over the 4 CPUs, reducing with TensorFlow's collectives."""
    reducer = cross_device_ops.CollectiveAllReduce(
        DEVICES, REPLICAS, collective_util.Options(),
        collective_keys=cross_device_utils.CollectiveKeys(group_key_start=GROUP_KEYS))
    return tf.distribute.MirroredStrategy(DEVICES, cross_device_ops=reducer)


def made(source, rows):
    """A (rows, 3) float32 tensor of 1.5s, from NumPy or from TensorFlow."""
    if source == "numpy":
        return tf.constant(np.full((rows, 3), 1.5, np.float32))
    return tf.fill([rows, 3], 1.5)


def transferred(strategy, call, traced, source, rows):
    """Each local result of `call` on every replica's (rows, 3) tensor."""
    def replica_step():
        value = made(source, rows)
        context = tf.distribute.get_replica_context()
        if call == "ReplicaContext.all_reduce":
            return context.all_reduce("SUM", value)
        if call == "ReplicaContext.all_gather":
            return context.all_gather(value, axis=0)
        return value

    def step():
        per_replica = strategy.run(replica_step)
        if call == "strategy.gather":
            return strategy.gather(per_replica, axis=0)
        if call == "strategy.reduce":
            return strategy.reduce("SUM", per_replica, axis=None)
        return per_replica

    result = (tf.function(step) if traced else step)()
    return list(strategy.experimental_local_results(result))


def expected(call, rows):
    """NumPy's result of `call` over the replicas' (rows, 3) tensors of 1.5s."""
    parts = [np.full((rows, 3), 1.5, np.float32)] * REPLICAS
    if call in ("ReplicaContext.all_reduce", "strategy.reduce"):
        return np.sum(parts, axis=0)
    return np.concatenate(parts, axis=0)


@pytest.mark.parametrize("source", ["numpy", "tensorflow"])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("configuration", testing.PATCHED_CONFIGURATIONS, indirect=True)
def test_a_tensor_of_no_elements_gives_numpys_result_where_tensorflow_puts_it(
        collective_strategy, configuration, call, traced, source):
    found = transferred(collective_strategy, call, traced, source, rows=0)
    with_elements = transferred(collective_strategy, call, traced, source, rows=2)
    wanted = expected(call, 0)
    assert len(found) == (1 if call.startswith("strategy.") else REPLICAS)
    for result in found:
        assert result.dtype == tf.float32
        np.testing.assert_array_equal(result.numpy(), wanted)
        assert result.shape == wanted.shape
    assert [r.device for r in found] == [r.device for r in with_elements]
    for result in with_elements:  # the same path, with elements: TensorFlow's
        np.testing.assert_array_equal(result.numpy(), expected(call, 2))


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
def test_uneven_rows_with_an_empty_replica_gather_as_numpy_concatenates(
        collective_strategy, traced):
    """Replica i holds i rows (replica 0 none): TensorFlow pads them to one
    length before its all-gather, so no tensor it sends is empty eagerly; in
    a graph that length is known only when running, and tfdtape pads again."""
    strategy = collective_strategy
    values = strategy.experimental_distribute_values_from_function(
        lambda context: tf.fill([context.replica_id_in_sync_group, 2],
                                float(context.replica_id_in_sync_group)))

    def step():
        return strategy.run(
            lambda value: tf.distribute.get_replica_context().all_gather(value, axis=0),
            args=(values,))

    found = strategy.experimental_local_results((tf.function(step) if traced else step)())
    wanted = np.concatenate([np.full((i, 2), float(i), np.float32) for i in range(REPLICAS)])
    for result in found:
        np.testing.assert_array_equal(result.numpy(), wanted)


def test_sparse_gradients_of_no_rows_reduce_to_no_rows(collective_strategy):
    """An embedding's gradient when no replica's batch has a row: an
    IndexedSlices of no values, all-reduced by all-gathering its values and
    indices."""
    strategy = collective_strategy
    table = tf.constant(np.arange(15, dtype=np.float32).reshape(5, 3))

    def replica_step():
        ids = tf.constant(np.empty((0,), np.int32))
        with tf.GradientTape() as tape:
            tape.watch(table)
            loss = tf.reduce_sum(tf.gather(table, ids))
        gradient = tape.gradient(loss, table)
        assert isinstance(gradient, tf.IndexedSlices)
        return tf.distribute.get_replica_context().all_reduce("SUM", gradient)

    for result in strategy.experimental_local_results(tf.function(
            lambda: strategy.run(replica_step))()):
        np.testing.assert_array_equal(tf.convert_to_tensor(result).numpy(),
                                      np.zeros((5, 3), np.float32))


STOCK_GATHER = """
import numpy as np, tensorflow as tf
from tensorflow.python.distribute import collective_util, cross_device_ops
from tfdtape import testing
devices = testing.virtual_cpus(2)
strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=(
    cross_device_ops.CollectiveAllReduce(devices, 2, collective_util.Options())))
with testing.stock():
    per_replica = strategy.run(lambda: tf.constant(np.empty((0, 3), np.float32)))
    print("gathered", strategy.gather(per_replica, axis=0).shape, flush=True)
"""


@pytest.mark.per_release(False)
def test_stock_tensorflow_ends_the_process_on_the_same_gather():
    """The control: TensorFlow as it ships, on one of the tests' calls (2.12
    gathered such a tensor; releases.empty_collectives_end_the_process)."""
    crashes = releases.empty_collectives_end_the_process()
    if crashes is None:
        pytest.skip(f"stock TensorFlow {tf.__version__} was not measured on this gather")
    completed = subprocess.run([sys.executable, "-c", STOCK_GATHER], capture_output=True,
                               text=True, timeout=300,
                               env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    if crashes:
        assert completed.returncode == -signal.SIGSEGV, (
            completed.returncode, completed.stderr[-2000:])
        assert "gathered" not in completed.stdout
    else:
        assert completed.returncode == 0, completed.stderr[-2000:]
        assert completed.stdout.splitlines()[-1] == "gathered (0, 3)"


# Regressions found by the break-it review of the first version, which
# chose padding from each member's static shape alone.

def test_members_that_know_their_shapes_differently_still_transfer_alike(
        collective_strategy):
    """Replica 0's values and indices have a first dimension unknown when
    tracing, the other replicas' are known (2 rows each when running), as a
    worker that retraced a `tf.function` with relaxed shapes: every member
    must send the same shape (the first version sent replica 0's padded:
    'Shape mismatch in the collective instance')."""
    strategy = collective_strategy

    def replica_step():
        context = tf.distribute.get_replica_context()
        replica = tf.get_static_value(context.replica_id_in_sync_group)
        values = tf.fill([2, 3], float(replica) + 1.0)
        indices = tf.constant([0, 2], tf.int64)
        if replica == 0:
            values = tf.compat.v1.placeholder_with_default(values, [None, 3])
            indices = tf.compat.v1.placeholder_with_default(indices, [None])
        slices = tf.IndexedSlices(values, indices, tf.constant([4, 3], tf.int64))
        return tf.convert_to_tensor(context.all_reduce("SUM", slices))

    wanted = np.zeros((4, 3), np.float32)
    wanted[[0, 2]] = sum(range(1, REPLICAS + 1))
    for result in strategy.experimental_local_results(
            tf.function(lambda: strategy.run(replica_step))()):
        np.testing.assert_array_equal(result.numpy(), wanted)


def test_an_all_reduce_traced_for_any_rows_takes_a_numpy_tensor_of_none(
        collective_strategy):
    """A `tf.function` retraced with a relaxed first dimension, then called
    with tensors made from an empty NumPy array: stock TensorFlow 2.21 ends
    the process with SIGSEGV (the first version let such a tensor through,
    its static shape not saying it was empty)."""
    strategy = collective_strategy

    @tf.function(reduce_retracing=True)
    def step(per_replica):
        return strategy.run(
            lambda x: tf.distribute.get_replica_context().all_reduce("SUM", x),
            args=(per_replica,))

    for rows in (2, 1, 0):
        per_replica = strategy.experimental_distribute_values_from_function(
            lambda context, rows=rows: tf.constant(np.ones((rows, 3), np.float32)))
        for result in strategy.experimental_local_results(step(per_replica)):
            np.testing.assert_array_equal(result.numpy(),
                                          np.full((rows, 3), REPLICAS, np.float32))
