"""Keras 2 optimizers (tf_keras; `tf.keras` up to TensorFlow 2.15) applying in
cross-replica context without `skip_gradients_aggregation=True`.

Their `apply_gradients` first all-reduces the gradients across replicas
(`aggregate_gradients`, through `get_replica_context().merge_call`), which in
cross-replica context fails: `'NoneType' object has no attribute
'merge_call'`. A gradient there (the total of a tape around `strategy.run`,
or of a tape in cross-replica context) is the same for every replica
already: tfdtape's `aggregate_gradients` hands it on as it is under a
strategy in cross-replica context, after refusing per-replica values (what
`strategy.run` returned: each replica's copy would get its own value; the
optimizer's first apply would otherwise fail first on TensorFlow's internals
where the scope is another strategy's, which is refused too). What else
would be wrong to apply
there (several workers) is refused by the apply itself
(`tfdtape.merge_calls`). Everywhere else Keras's function runs unchanged.

Keras is never imported here: the classes are looked up in `sys.modules`,
where the Keras 2 optimizer module lives in each release (`OPTIMIZER_MODULES`),
when tfdtape installs and again when tf_keras is imported later
(`tfdtape.late_imports`).
"""

import functools
import inspect
import sys

from tfdtape import apply_checks
from tfdtape import compat

OPTIMIZER_MODULES = (
    "tf_keras.src.optimizers.optimizer",  # tf_keras (TensorFlow 2.15 and later)
    "keras.src.optimizers.optimizer",     # Keras 2.13 to 2.15
    "keras.optimizers.optimizer",         # Keras 2.12
)
ATTRIBUTE = "aggregate_gradients"
PARAMETERS = ("self", "grads_and_vars")
_SYMBOL = "Optimizer.apply_gradients (Keras 2)"


def keras2_classes():
    """The loaded Keras 2 `Optimizer` classes that define
    `aggregate_gradients(self, grads_and_vars)` themselves (Keras 3's
    optimizer module holds a class without it)."""
    found = []
    for name in OPTIMIZER_MODULES:
        module = sys.modules.get(name)
        cls = None if module is None else vars(module).get("Optimizer")
        method = vars(cls).get(ATTRIBUTE) if isinstance(cls, type) else None
        if (method is not None and
                tuple(inspect.signature(method).parameters) == PARAMETERS and
                cls not in found):
            found.append(cls)
    return found


def make_aggregate_gradients(original):
    """Returns an `Optimizer.aggregate_gradients` that, under a strategy in
    cross-replica context, returns the gradients as they are."""

    @functools.wraps(original)
    def aggregate_gradients(self, grads_and_vars):
        current, replica_context = (
            compat.strategy_context.get_strategy_and_replica_context())
        if replica_context is None and compat.strategy_context.has_strategy():
            grads_and_vars = list(grads_and_vars)
            apply_checks.check_no_per_replica_values(
                (grads_and_vars,), {}, _SYMBOL)
            apply_checks.check_strategies(
                getattr(self, "_distribution_strategy", None), current,
                apply_checks.distributed_variables(grads_and_vars), _SYMBOL)
            return grads_and_vars
        return original(self, grads_and_vars)

    return aggregate_gradients
