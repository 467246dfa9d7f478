"""Keras 3's `fit`, `evaluate` and `predict` on MultiWorkerMirroredStrategy.

Keras's TensorFlow trainer fails there before the first step, on stock
TensorFlow (tensorflow#72388, keras-team/keras#20585), at two places:

- the trainer's `_maybe_symbolic_build` (`TensorFlowTrainer`; `Trainer` in
  keras-nightly) builds the model from the first batch, reduced with
  `strategy.reduce("MEAN", batch, axis=None)` over the whole `(x, y,
  sample_weight)` structure, which a strategy of several workers cannot
  take ("Attempt to convert a value (PerReplica ...) to a Tensor"). The
  build needs the batch's shapes and dtypes only: tfdtape's version hands
  Keras this worker's first replica's share of each element (the shape a
  replica sees, as the reduced mean has), with no collective.
- `reduce_per_replica` reduces the logs with `strategy.reduce("MEAN", v,
  axis=0)` on several workers, which fails on a scalar ("Invalid reduction
  dimension 0 for input with 0 dimensions") and would average a vector
  metric's entries together. tfdtape's version takes the mean across
  replicas element by element (`axis=None`), which is what Keras computes
  on one worker (`reduce_mean(local results, axis=0)`).

Everywhere else (one worker, another reduction, no strategy) Keras's
functions run unchanged. Keras is never imported here.
"""

import functools
import sys

from tensorflow.python.distribute import collective_all_reduce_strategy
from tensorflow.python.distribute import values as values_lib
from tensorflow.python.util import nest

from tfdtape import keras3_distribution
from tfdtape import workers

DEFINING_MODULE = "keras.src.backend.tensorflow.trainer"
"""Where Keras 3 defines its TensorFlow trainer (watched for by
`tfdtape.late_imports`)."""
BUILD_ATTRIBUTE = "_maybe_symbolic_build"
BUILD_PARAMETERS = ("self", "iterator", "data_batch")
REDUCE_ATTRIBUTE = "reduce_per_replica"
REDUCE_PARAMETERS = ("values", "strategy", "reduction")


def trainer_module():
    """Keras 3's TensorFlow trainer module, if loaded; else None."""
    return sys.modules.get(DEFINING_MODULE)


TRAINER_NAMES = ("TensorFlowTrainer", "Trainer")
"""The trainer class's name: `TensorFlowTrainer` up to Keras 3.15, `Trainer`
in keras-nightly 3.16."""


def trainer_class():
    """Keras 3's TensorFlow trainer class, if loaded; else None."""
    module = trainer_module()
    for name in TRAINER_NAMES if module is not None else ():
        found = vars(module).get(name)
        if isinstance(found, type) and BUILD_ATTRIBUTE in vars(found):
            return found
    return None


def _first_share(element):
    """This worker's first replica's value of a distributed element; any
    other element as it is."""
    if isinstance(element, values_lib.DistributedValues):
        return element._values[0]
    return element


def make_maybe_symbolic_build(original):
    """Returns a `_maybe_symbolic_build` that, on several workers, builds
    from the first replica's share of the first batch."""

    @functools.wraps(original)
    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        keras3_distribution.check_model(self)
        strategy = self._distribute_strategy
        if iterator is None or strategy is None or not workers.in_multi_worker_mode(strategy):
            return original(self, iterator=iterator, data_batch=data_batch)
        for _, _, batches in iterator:
            data_batch = nest.map_structure(_first_share, next(batches))
            break
        return original(self, data_batch=data_batch)

    return _maybe_symbolic_build


def make_reduce_per_replica(original):
    """Returns a `reduce_per_replica` that, on several workers, takes
    the mean of the logs across replicas element by element."""

    @functools.wraps(original)
    def reduce_per_replica(values, strategy, reduction):
        if (reduction not in ("auto", "mean") or
                not isinstance(strategy, collective_all_reduce_strategy.CollectiveAllReduceStrategy)
                or not workers.in_multi_worker_mode(strategy)):
            return original(values, strategy, reduction)
        return nest.map_structure(
            lambda value: strategy.reduce("MEAN", value, axis=None), values)

    return reduce_per_replica
