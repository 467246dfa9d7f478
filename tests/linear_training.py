"""A linear model trained for a few steps with a tape under any strategy.

Shared by the multi-worker test and the worker processes it starts, so both
sides train the same model on the same data.
"""

import numpy as np
import tensorflow as tf

FEATURES = np.arange(16, dtype=np.float32).reshape(8, 2) / 8.0
TARGETS = FEATURES @ np.array([[2.0], [-1.0]], np.float32) + 0.5
REPLICAS = 2
STEPS = 3


def shard(replica_id):
    """The (features, targets) batch of one replica."""
    size = len(FEATURES) // REPLICAS
    return (FEATURES[replica_id * size:][:size],
            TARGETS[replica_id * size:][:size])


def train(strategy, replica_id_of_worker=None):
    """Trains STEPS steps; returns (kernel, bias, watched_containers).

    Each replica gets `shard(its replica id)`; in a multi-worker run each worker
    holds one replica, whose id is `replica_id_of_worker`. watched_containers
    is True when every tape watched exactly the kernel and bias containers.
    """
    with strategy.scope():
        kernel = tf.Variable([[0.5], [-0.5]])
        bias = tf.Variable([0.0])
        optimizer = tf.keras.optimizers.SGD(0.1)
    watched = []

    def batch(context):
        replica = (context.replica_id_in_sync_group
                   if replica_id_of_worker is None else replica_id_of_worker)
        return shard(replica)

    batches = strategy.experimental_distribute_values_from_function(batch)

    def replica_step(features, targets):
        with tf.GradientTape() as tape:
            error = tf.matmul(features, kernel) + bias - targets
            loss = tf.reduce_sum(error * error) / len(FEATURES)
        found = tape.watched_variables()
        watched.append(len(found) == 2 and found[0] is kernel and found[1] is bias)
        gradients = tape.gradient(loss, [kernel, bias])
        optimizer.apply_gradients(zip(gradients, [kernel, bias]))

    step = tf.function(lambda: strategy.run(replica_step, args=batches),
                       autograph=False)
    for _ in range(STEPS):
        step()
    return kernel.numpy(), bias.numpy(), bool(watched) and all(watched)
