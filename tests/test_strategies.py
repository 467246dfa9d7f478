"""The semantics on every strategy a single process can run.

Each strategy runs on a subset of the session's 4 virtual CPUs. Where a
strategy wraps variables in a container (MirroredVariable for MirroredStrategy,
AggregatingVariable for CentralStorageStrategy), the tape must watch the
container in replica context, and the pre-seed control watches what is inside.
The default strategy and OneDeviceStrategy use plain variables: nothing to
resolve, so every configuration agrees.
"""

import pytest
import tensorflow as tf

from assertions import assert_same_objects
from conftest import DEVICES
from tfdtape import resolution
from tfdtape.testing import PATCHED_CONFIGURATIONS

pytestmark = pytest.mark.per_release

STRATEGIES = {
    "default": lambda: tf.distribute.get_strategy(),
    "one_device": lambda: tf.distribute.OneDeviceStrategy(DEVICES[0]),
    "mirrored_1": lambda: tf.distribute.MirroredStrategy(DEVICES[:1]),
    "mirrored_2": lambda: tf.distribute.MirroredStrategy(DEVICES[:2]),
    "mirrored_4": lambda: tf.distribute.MirroredStrategy(DEVICES),
    "central_storage": lambda: tf.distribute.experimental.CentralStorageStrategy(
        DEVICES[:2]),
}


def inner_variable(variable, replica_id):
    """What a replica's read hands the tape before the commit."""
    if hasattr(variable, "values"):  # MirroredVariable: the replica's component
        return variable.values[replica_id]
    return getattr(variable, "_v", variable)  # AggregatingVariable: its inner variable


@pytest.fixture(scope="module", params=sorted(STRATEGIES))
def named_strategy(request):
    return request.param, STRATEGIES[request.param]()


def test_replica_context_watches_the_container(named_strategy, configuration):
    name, strategy = named_strategy
    with strategy.scope():
        v = tf.Variable(3.0)
    watched = {}

    def step():
        replica_id = int(tf.get_static_value(
            tf.distribute.get_replica_context().replica_id_in_sync_group))
        with tf.GradientTape() as tape:
            loss = v * v
        watched[replica_id] = tape.watched_variables()
        return tape.gradient(loss, v)

    gradients = strategy.run(step)
    assert sorted(watched) == list(range(strategy.num_replicas_in_sync))
    wraps = name.startswith(("mirrored", "central"))
    for replica_id, found in watched.items():
        if configuration == "pre_seed" and wraps:
            assert_same_objects(found, [inner_variable(v, replica_id)])
            assert found[0] is not v
        else:
            assert_same_objects(found, [v])
    assert [float(g) for g in strategy.experimental_local_results(gradients)] == (
        [6.0] * strategy.num_replicas_in_sync)


def test_cross_replica_watch_and_gradient(named_strategy, configuration):
    name, strategy = named_strategy
    with strategy.scope():
        v = tf.Variable(3.0)
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            try:
                tape.watch(v)
            except ValueError as error:
                assert name.startswith("mirrored")
                assert configuration not in PATCHED_CONFIGURATIONS
                assert "DistributedVariable.handle is not available" in str(error)
                return
            loss = v * v
        gradient = tape.gradient(loss, v)
    assert name.startswith(("default", "one_device", "central")) or (
        configuration in PATCHED_CONFIGURATIONS)
    expected = list(v.values) if name.startswith("mirrored") else [v]
    assert_same_objects(resolution.watched_by(tape), expected)
    assert_same_objects(tape.watched_variables(), [v])
    assert float(gradient) == 6.0
