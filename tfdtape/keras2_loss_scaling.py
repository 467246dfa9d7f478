"""Keras 2's `LossScaleOptimizer` (tf_keras; `tf.keras` up to TensorFlow
2.15) applying in cross-replica context.

Its `apply_gradients` refuses cross-replica context (`apply_gradients() must
be called in a replica context`). In replica context it all-reduces the
gradients (unless told to skip that), then in one `merge_call` checks them
for finiteness, updates the loss scale once, and applies them through the
inner optimizer (once, through the inner optimizer's own `merge_call`) or
skips the step. A gradient in cross-replica context (the total of a tape
around `strategy.run`) is the same for every replica already, so tfdtape's
`apply_gradients` runs Keras's own replica-context path once, inside
`strategy.run`, with the aggregation skipped: every replica hands the same
total to that `merge_call`. It refuses what `maybe_merge_call` refuses in
cross-replica context (per-replica values, several workers) before touching
any variable. Everywhere else Keras's function runs unchanged.

Both classes are patched: `LossScaleOptimizerV3` (around a Keras 2
`Optimizer`, aggregation skipped by `skip_gradients_aggregation=True`) and
the legacy `LossScaleOptimizer` (around an `optimizers.legacy` one,
`experimental_aggregate_gradients=False`). Keras is never imported here:
the classes are looked up in `sys.modules` where each release defines them
(`DEFINING_MODULES`), when tfdtape installs and again when tf_keras is
imported later (`tfdtape.late_imports`).
"""

import functools
import inspect
import sys

from tensorflow.python.framework import ops

from tfdtape import apply_checks
from tfdtape import compat

DEFINING_MODULES = (
    "tf_keras.src.mixed_precision.loss_scale_optimizer",  # tf_keras
    "keras.src.mixed_precision.loss_scale_optimizer",     # Keras 2.13 to 2.15
    "keras.mixed_precision.loss_scale_optimizer",         # Keras 2.12
)
ATTRIBUTE = "apply_gradients"
PARAMETERS = {
    "LossScaleOptimizerV3": ("self", "grads_and_vars", "skip_gradients_aggregation",
                             "kwargs"),
    "LossScaleOptimizer": ("self", "grads_and_vars", "name",
                           "experimental_aggregate_gradients"),
}
"""Each class patched, and the parameters its `apply_gradients` must have."""
_SYMBOL = "tf_keras.mixed_precision.LossScaleOptimizer.apply_gradients"


def keras2_classes():
    """(class, its `apply_gradients` parameters) for each loaded Keras 2 loss
    scale optimizer class that defines `apply_gradients` with the expected
    parameters itself (a class that changed keeps its own refusal)."""
    found = []
    for module_name in DEFINING_MODULES:
        module = sys.modules.get(module_name)
        if module is None:
            continue
        for class_name, parameters in PARAMETERS.items():
            cls = vars(module).get(class_name)
            method = vars(cls).get(ATTRIBUTE) if isinstance(cls, type) else None
            if (method is not None and
                    tuple(inspect.signature(method).parameters) == parameters and
                    all(cls is not known for known, _ in found)):
                found.append((cls, parameters))
    return found


def make_apply_gradients(original):
    """Returns a `LossScaleOptimizerV3.apply_gradients` that, under a
    strategy in cross-replica context, applies as described above."""

    @functools.wraps(original)
    def apply_gradients(self, grads_and_vars, skip_gradients_aggregation=False,
                        **kwargs):
        strategy = _cross_replica_strategy()
        if strategy is None:
            return original(self, grads_and_vars, skip_gradients_aggregation,
                            **kwargs)
        grads_and_vars = _checked(strategy, grads_and_vars)
        kwargs.pop("experimental_aggregate_gradients", None)
        with ops.init_scope():  # As Keras builds it, before its checks.
            self.build([variable for _, variable in grads_and_vars])
        return _once_in_the_replicas(strategy, lambda: original(
            self, grads_and_vars, True, **kwargs))

    return apply_gradients


def make_legacy_apply_gradients(original):
    """Returns a legacy `LossScaleOptimizer.apply_gradients` that, under a
    strategy in cross-replica context, applies as described above."""

    @functools.wraps(original)
    def apply_gradients(self, grads_and_vars, name=None,
                        experimental_aggregate_gradients=True):
        strategy = _cross_replica_strategy()
        if strategy is None:
            return original(self, grads_and_vars, name,
                            experimental_aggregate_gradients)
        grads_and_vars = _checked(strategy, grads_and_vars)
        return _once_in_the_replicas(strategy, lambda: original(
            self, grads_and_vars, name, False))

    return apply_gradients


REPLACEMENTS = {"LossScaleOptimizerV3": make_apply_gradients,
                "LossScaleOptimizer": make_legacy_apply_gradients}
"""Each class's replacement maker."""


def _cross_replica_strategy():
    """The current strategy in cross-replica context; None in replica
    context and with no strategy (Keras's own path)."""
    strategy, replica_context = (
        compat.strategy_context.get_strategy_and_replica_context())
    if replica_context is not None or not compat.strategy_context.has_strategy():
        return None
    return strategy


def _checked(strategy, grads_and_vars):
    """`grads_and_vars` as a list, after the refusals of a cross-replica
    apply."""
    grads_and_vars = list(grads_and_vars)
    apply_checks.check_single_worker(strategy, _SYMBOL, "cannot apply gradients")
    apply_checks.check_no_per_replica_values((grads_and_vars,), {}, _SYMBOL)
    return grads_and_vars


def _once_in_the_replicas(strategy, apply):
    """Runs `apply` (Keras's replica-context path, aggregation skipped) in
    every replica: its `merge_call` applies once. Returns what the first
    replica's call returned."""
    results = strategy.run(apply)
    return None if results is None else strategy.experimental_local_results(results)[0]
