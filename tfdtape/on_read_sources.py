"""Outside any strategy: the derivative with respect to an ON_READ variable.

Outside the replicas a SyncOnRead (ON_READ) variable stands for its
aggregate: the sum of its components (SUM), their mean (MEAN), or the first
(ONLY_FIRST_REPLICA). TensorFlow differentiates with respect to the first
component alone. From the gradients g_0 … g_(n-1) with respect to all n
local components, tfdtape gives the derivative with respect to the aggregate
where there is one:

- no component beyond the first took part: g_0, TensorFlow's own answer;
- every component took part with the same gradient (the computation read the
  aggregate, so a change of it changes the target alike however it is spread
  over the components): g_0 for SUM, n * g_0 for MEAN (TensorFlow's g_0 is
  1/n of it);
- otherwise (the replicas of a strategy.run read their own components, each
  with its own share) there is none, and the gradient is refused.

Gradients are compared by value: eagerly at once, in a `tf.function` by an
assertion that runs with the gradient it guards.
"""

import numpy as np
from tensorflow.python.eager import context
from tensorflow.python.framework import indexed_slices
from tensorflow.python.framework import ops
from tensorflow.python.ops import array_ops
from tensorflow.python.ops import math_ops
from tensorflow.python.ops import variables

from tfdtape import compat
from tfdtape import errors
from tfdtape import events

_SYMBOL = "tf.GradientTape.gradient"
OUTSIDE = "outside any strategy"
CROSS_REPLICA = "in cross-replica context"
_SHARES = ("whose components took part with different gradients (the "
           "replicas of a strategy.run read their own, each with its own "
           "share), so that its {} aggregate has no one derivative")


def is_on_read(variable):
    """True for a distributed variable synchronized ON_READ."""
    return variable.synchronization == variables.VariableSynchronization.ON_READ


def derivative(variable, gradients):
    """The derivative with respect to the aggregate of `variable`, an ON_READ
    distributed variable, from `gradients` (one per local component, None
    where it took no part), by the rules of the module doc.

    Raises:
        ValueError: there is none (eagerly; while tracing, where the
            components that took part tell). In a `tf.function` whose
            gradients may still differ, the gradient's computation raises
            InvalidArgumentError with the same message when they do.
    """
    first, others = gradients[0], gradients[1:]
    if all(g is None for g in others):
        return first
    aggregation = variable.aggregation
    why = _SHARES.format(aggregation.name)
    summing = aggregation == variables.VariableAggregation.SUM
    if any(g is None for g in gradients) or not (
            summing or aggregation == variables.VariableAggregation.MEAN):
        raise refusal(variable, OUTSIDE, why)
    if context.executing_eagerly():
        first_value = ops.convert_to_tensor(first).numpy()
        if not all(np.array_equal(ops.convert_to_tensor(g).numpy(), first_value,
                                  equal_nan=True) for g in others):
            raise refusal(variable, OUTSIDE, why)
        checked = first
    else:
        text = str(refusal(variable, OUTSIDE, why, report=False))
        checks = [compat.graph_assert(_same_values(g, first), [text])
                  for g in others]
        with ops.control_dependencies(checks):
            checked = _map_values(array_ops.identity, first)
    if summing:
        return checked
    return _map_values(lambda values: values * len(gradients), checked)


def refusal(variable, where, why, report=True):
    """The ValueError for a gradient with respect to the ON_READ variable
    `variable`, which has no one derivative `where` because of `why`;
    reported to the open sinks unless `report` is False."""
    expected = "an ON_WRITE distributed variable such as a MirroredVariable"
    if where == OUTSIDE:
        expected += ", or an ON_READ one read as a whole"
    error = ValueError(errors.message(
        f"cannot differentiate with respect to {variable.name!r} {where}",
        _SYMBOL, expected, f"an ON_READ {type(variable).__name__}, {why}",
        "Compute the gradient inside strategy.run, where each replica "
        "differentiates with respect to its own component"))
    return events.refused(error) if report else error


def _same_values(one, other):
    """A boolean tensor: whether two gradients hold the same values (NaN
    where the other has NaN counts as the same: the derivative is NaN)."""
    one, other = ops.convert_to_tensor(one), ops.convert_to_tensor(other)
    same = math_ops.logical_or(math_ops.equal(one, other), math_ops.logical_and(
        math_ops.is_nan(one), math_ops.is_nan(other)))
    return math_ops.reduce_all(same)


def _map_values(function, gradient):
    """`function` applied to a dense gradient, or to an IndexedSlices'
    values (its indices kept)."""
    if isinstance(gradient, indexed_slices.IndexedSlices):
        return indexed_slices.IndexedSlices(
            function(gradient.values), gradient.indices, gradient.dense_shape)
    return function(gradient)
