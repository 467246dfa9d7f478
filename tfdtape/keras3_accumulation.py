"""Keras 3 gradient accumulation (`gradient_accumulation_steps`) inside the
replicas of a strategy: applied once, in cross-replica context.

Keras's `BaseOptimizer._backend_apply_gradients` chooses between updating
and accumulating with a `cond`, and both branches merge across replicas
(the update all-reduces the gradients, each branch updates mirrored
variables through `maybe_merge_call`). Inside `strategy.run` in a graph (a
`tf.function` step, `model.fit`) a `merge_call` inside a `cond` branch
fails: "merge_call called while defining a new graph or a tf.function"
(keras-team/keras#20582). tfdtape's replacement merges first: in the
replicas of a strategy that merges, one `merge_call` sums every replica's
gradients through the strategy's `batch_reduce_to` (as Keras's own
all-reduce does, across workers too) and runs Keras's function once in
cross-replica context with the sums, where its `cond` holds no merge and the
cross-replica apply of `tfdtape.merge_calls` updates every copy. The
accumulators, the update every `gradient_accumulation_steps` steps (of the
summed gradients' mean over the steps, clipped after), weight decay and EMA
are Keras's own, so the step is one device's on the global batch. The
iteration counter stays Keras's, counted where Keras counts it.

Everywhere else (no accumulation, no strategy, cross-replica context,
strategies that merge nothing) Keras's function runs unchanged.

Keras is never imported here: the class is found from what Keras exports
(`keras.optimizers.Optimizer`), as `tfdtape.keras3_loss_scaling` finds its.
"""

import functools
import inspect
import sys

from tensorflow.python.distribute import merge_call_interim
from tensorflow.python.distribute import reduce_util

from tfdtape import compat
from tfdtape import keras_variables

ATTRIBUTE = "_backend_apply_gradients"
PARAMETERS = ("self", "grads", "trainable_variables")
DEFINING_MODULE = "keras.src.optimizers.base_optimizer"
"""Where Keras 3 defines the class (watched for by `tfdtape.late_imports`)."""
_SYMBOL = "keras.optimizers.Optimizer.apply"


def keras_class():
    """The class of Keras 3's optimizers that defines
    `_backend_apply_gradients(self, grads, trainable_variables)` (its
    `BaseOptimizer`), if Keras 3 is loaded; else None."""
    keras_module = sys.modules.get("keras")
    optimizers = None if keras_module is None else vars(keras_module).get("optimizers")
    exported = None if optimizers is None else vars(optimizers).get("Optimizer")
    if not isinstance(exported, type):
        defining = sys.modules.get(DEFINING_MODULE)
        exported = None if defining is None else vars(defining).get("BaseOptimizer")
    if not isinstance(exported, type):
        return None
    for cls in exported.__mro__:
        method = vars(cls).get(ATTRIBUTE)
        if method is not None:
            parameters = tuple(inspect.signature(method).parameters)
            return cls if parameters == PARAMETERS else None
    return None


def make_backend_apply_gradients(original):
    """Returns a `_backend_apply_gradients` that, accumulating in the
    replicas of a strategy that merges, applies once in cross-replica
    context as described above."""

    @functools.wraps(original)
    def _backend_apply_gradients(self, grads, trainable_variables):
        if not self.gradient_accumulation_steps:
            return original(self, grads, trainable_variables)
        replica_context = compat.strategy_context.get_replica_context()
        if (replica_context is None or not compat.strategy_context.has_strategy() or
                merge_call_interim.strategy_supports_no_merge_call()):
            return original(self, grads, trainable_variables)
        destinations = [keras_variables.unwrap(variable, _SYMBOL)
                        for variable in trainable_variables]

        def apply_once(strategy, *per_replica):
            sums = strategy.extended.batch_reduce_to(
                reduce_util.ReduceOp.SUM, list(zip(per_replica, destinations)))
            original(self, list(sums), trainable_variables)

        replica_context.merge_call(apply_once, args=tuple(grads))

    return _backend_apply_gradients
