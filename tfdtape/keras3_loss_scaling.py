"""Keras 3's `LossScaleOptimizer` (mixed precision) applying in
cross-replica context.

Its TensorFlow path (`_tf_apply`) refuses cross-replica context (`apply()
must be called in a replica context`): in replica context it checks each
replica's gradients for finiteness in a `merge_call`, takes the first
replica's answer, and applies through the inner optimizer there, once per
replica. Following that advice with the total of a tape around
`strategy.run` applies it once per replica, N times. And the first
replica's answer is not the step's: its gradients are its own, not yet
all-reduced, so tfdtape's `check_finite` all-reduces every replica's answer
there (`make_check_finite`).

The gradient of a tape around the run is already the total, the same for
every replica, so in cross-replica context tfdtape's `_tf_apply` runs what
Keras runs without a distribution strategy (`_common_apply`): one finite
check on the total, then either the unscaled total applied once through the
inner optimizer (whose own cross-replica apply goes through tfdtape's
`maybe_merge_call`) and the step counter advanced, or the step skipped and
the scale halved; the scale variables are mirrored and updated once.
Per-replica values are refused before any variable is touched. On several
workers the totals are the same on every worker (all-reduced across them),
so every worker takes the same branch; the inner optimizer's apply goes
through `maybe_merge_call`'s checks that what it applies agrees across
workers. Everywhere else Keras's function runs unchanged.

Keras is never imported here: the class is looked up in `sys.modules`
through what Keras exports (`keras.optimizers.LossScaleOptimizer`) when
tfdtape installs. TensorFlow 2.16 and later import Keras's optimizers when
TensorFlow is imported (`tensorflow/__init__.py`), so the class is usually
there then; where Keras is imported first and tfdtape installs while it is
half imported (`python -m tfdtape run` on a script that imports Keras
before TensorFlow), `tfdtape.late_imports` patches the class when its
defining module has loaded. With `TF_USE_LEGACY_KERAS=1` (tf_keras instead)
a Keras 3 imported later keeps its own refusal.
"""

import functools
import inspect
import sys

from tensorflow.python.distribute import reduce_util
from tensorflow.python.framework import dtypes
from tensorflow.python.ops import math_ops

from tfdtape import apply_checks
from tfdtape import compat

ATTRIBUTE = "_tf_apply"
PARAMETERS = ("self", "grads", "trainable_variables")
CHECK_ATTRIBUTE = "check_finite"
CHECK_PARAMETERS = ("self", "grads")
_SYMBOL = "keras.optimizers.LossScaleOptimizer.apply"
DEFINING_MODULE = "keras.src.optimizers.loss_scale_optimizer"
"""Where Keras 3 defines the class (watched for by `tfdtape.late_imports`)."""


def keras_class():
    """Keras 3's exported `LossScaleOptimizer` class, if Keras is loaded and
    the class defines `_tf_apply(self, grads, trainable_variables)` itself;
    else None (Keras 2, or a Keras whose class changed: its own refusal
    stays)."""
    keras_module = sys.modules.get("keras")
    optimizers = None if keras_module is None else vars(keras_module).get("optimizers")
    found = None if optimizers is None else vars(optimizers).get("LossScaleOptimizer")
    if found is None:  # Keras still importing (`late_imports`): its defining module
        defining = sys.modules.get(DEFINING_MODULE)
        found = None if defining is None else vars(defining).get("LossScaleOptimizer")
    method = vars(found).get(ATTRIBUTE) if isinstance(found, type) else None
    if method is not None and tuple(inspect.signature(method).parameters) == PARAMETERS:
        return found
    return None


def make_tf_apply(original):
    """Returns a `LossScaleOptimizer._tf_apply` that, under a strategy in
    cross-replica context, applies the gradients once as described above."""

    @functools.wraps(original)
    def _tf_apply(self, grads, trainable_variables=None):
        strategy, replica_context = (
            compat.strategy_context.get_strategy_and_replica_context())
        if (replica_context is not None or
                not compat.strategy_context.has_strategy() or
                not hasattr(self, "_common_apply")):
            if replica_context is not None:
                # Each replica unscales its copy of a total, and the inner
                # optimizer adds the copies up (measured: 4x on 4 replicas).
                apply_checks.check_no_total(
                    strategy.num_replicas_in_sync, grads, _SYMBOL)
            return original(self, grads, trainable_variables)
        apply_checks.check_no_per_replica_values((grads,), {}, _SYMBOL)
        self._common_apply(grads, trainable_variables=trainable_variables)

    return _tf_apply


def make_check_finite(original):
    """Returns a `LossScaleOptimizer.check_finite` that, in the replicas of
    a strategy of several, tells whether every replica's gradients (on
    every worker) are finite.

    Keras's replica-context path checks each replica's gradients in a
    `merge_call` and takes the first replica's answer, on the assumption that
    the gradients were all-reduced already; they are each replica's own, so a
    step that overflows on another replica only was applied (stock
    TensorFlow too). Here every replica's answer is all-reduced first (one
    scalar SUM of the non-finite flags), so all take the one device's
    branch. Elsewhere (cross-replica context, no strategy, one replica)
    Keras's check runs unchanged.
    """

    @functools.wraps(original)
    def check_finite(self, grads):
        finite = original(self, grads)
        strategy, replica_context = (
            compat.strategy_context.get_strategy_and_replica_context())
        if (replica_context is None or not compat.strategy_context.has_strategy() or
                strategy.num_replicas_in_sync == 1):
            return finite
        flags = math_ops.cast(math_ops.logical_not(finite), dtypes.float32)
        return math_ops.equal(
            replica_context.all_reduce(reduce_util.ReduceOp.SUM, flags), 0.0)

    return check_finite
