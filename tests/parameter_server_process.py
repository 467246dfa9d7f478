"""ParameterServerStrategy on an in-process cluster (2 workers, 1 ps over
loopback); prints, per configuration, what the tape watched, as JSON.

Run by tests/test_parameter_server.py in a fresh process: servers must start
before TensorFlow's runtime.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf

import loopback
from tfdtape import testing


def start_cluster():
    """Starts 2 worker servers and 1 ps server in this process."""
    ports = loopback.free_ports(3)
    cluster = tf.train.ClusterSpec({
        "worker": [f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}"],
        "ps": [f"127.0.0.1:{ports[2]}"]})
    servers = [tf.distribute.Server(cluster, job_name=job, task_index=index,
                                    protocol="grpc", start=True)
               for job, index in (("worker", 0), ("worker", 1), ("ps", 0))]
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        cluster, rpc_layer="grpc")
    return servers, tf.distribute.experimental.ParameterServerStrategy(resolver)


def observe(strategy, coordinator):
    with strategy.scope():
        v = tf.Variable(3.0)
    watched = []

    @tf.function
    def worker_fn():
        def replica_fn():
            with tf.GradientTape() as tape:
                loss = v * v
            watched.extend((type(w).__name__, w is v)
                           for w in tape.watched_variables())
            return tape.gradient(loss, v)
        return strategy.run(replica_fn)

    gradient = coordinator.schedule(worker_fn)
    coordinator.join()
    with strategy.scope():
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(v)
            loss = v * v
        cross_gradient = float(tape.gradient(loss, v))
    return {"variable": type(v).__name__,
            "replica_watched": watched,
            "replica_gradient": float(gradient.fetch()),
            "cross_watched": [type(w).__name__ for w in tape.watched_variables()],
            "cross_gradient": cross_gradient}


def main():
    servers, strategy = start_cluster()
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(
        strategy)
    results = {}
    for configuration in testing.CONFIGURATIONS:
        with testing.configuration(configuration):
            results[configuration] = observe(strategy, coordinator)
    print(json.dumps(results))
    del servers
    return 0


if __name__ == "__main__":
    sys.exit(main())
