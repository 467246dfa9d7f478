"""Trains linear_training's model and prints the result as JSON.

With TF_CONFIG set: one worker of a MultiWorkerMirroredStrategy cluster.
Without: the single-process reference, MirroredStrategy over 2 virtual CPUs.
Run by tests/test_multi_worker.py, each in a fresh process (a process holds
one device layout and one set of collective groups).
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf

import linear_training
import tfdtape
from tfdtape import testing


def main():
    if "TF_CONFIG" in os.environ:
        task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    else:
        task = None
        strategy = testing.mirrored_strategy(linear_training.REPLICAS)
    kernel, bias, watched_containers = linear_training.train(
        strategy, replica_id_of_worker=task)
    print(json.dumps({
        "task": task,
        "replicas": strategy.num_replicas_in_sync,
        "tfdtape_installed": tfdtape.is_installed(),
        "watched_containers": watched_containers,
        "kernel": kernel.tolist(),
        "bias": bias.tolist(),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
