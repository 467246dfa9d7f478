"""python examples/cluster/ray_train.py: Ray Train starts 2 workers, sets
TF_CONFIG for each and restarts the group once if a worker dies; each runs
examples/cluster/train.py's training (pip install "ray[train]")."""

import os
import runpy

from ray.train import FailureConfig
from ray.train import RunConfig
from ray.train import ScalingConfig
from ray.train.tensorflow import TensorflowTrainer

TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")


def loop():
    runpy.run_path(TRAIN, run_name="__main__")


if __name__ == "__main__":
    TensorflowTrainer(loop, scaling_config=ScalingConfig(num_workers=2),
                      run_config=RunConfig(failure_config=FailureConfig(max_failures=1))).fit()
