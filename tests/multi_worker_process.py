"""One worker of the multi-worker test: trains and prints its result as JSON.

Run by tests/test_multi_worker.py with TF_CONFIG naming this worker.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # pylint: disable=g-import-not-at-top

import tfdtape  # pylint: disable=g-import-not-at-top,unused-import
import linear_training  # pylint: disable=g-import-not-at-top


def main():
    task_index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    kernel, bias, watched_containers = linear_training.train(
        strategy, replica_id_of_worker=task_index)
    print(json.dumps({
        "task": task_index,
        "replicas": strategy.num_replicas_in_sync,
        "tfdtape_installed": tfdtape.is_installed(),
        "watched_containers": watched_containers,
        "kernel": kernel.tolist(),
        "bias": bias.tolist(),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
