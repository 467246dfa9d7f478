"""`maybe_merge_call` in cross-replica context: gradients apply there.

Keras 3 and tf_keras optimizers apply gradients through
`tf.__internal__.distribute.interim.maybe_merge_call(fn, strategy, ...)`,
which in TensorFlow calls `get_replica_context().merge_call(fn, ...)`: in
cross-replica context (inside `strategy.scope()`, outside `strategy.run`)
there is no replica context, and it fails with `'NoneType' object has no
attribute 'merge_call'`. What `merge_call` does for the replicas is call `fn`
once, in cross-replica context, with the strategy; tfdtape's replacement
does exactly that when the call is already in cross-replica context and
TensorFlow would otherwise go through `merge_call`, handing each device's
update its own copy of a total that `tape.gradient` reduced through the
strategy (`tfdtape.component_totals`). Everywhere else (replica
context, no strategy, strategies that need no merge_call) TensorFlow's
function runs unchanged.

Under a strategy of several workers (MultiWorkerMirroredStrategy) each
worker's apply updates its own copies, so every value it applies must be
the same on every worker: the totals `tape.gradient` all-reduced across the
workers are (`tfdtape.worker_totals`); anything else is checked first
(`tfdtape.apply_checks.check_apply`), and a value that differs between
workers is refused on every worker. A call given `PerReplica` values
(gradients returned from `strategy.run`) is refused: applied in
cross-replica context, each replica's copy would get its own value.

TensorFlow exports `maybe_merge_call` from several API modules (`tf.__internal__`
and `tf.compat.v2.__internal__` are separate module objects, and tf_keras
uses the latter); `modules_holding` finds every loaded module that holds
it, from the modules' own namespaces (no attribute lookup that would make a
lazily loaded module import).
"""

import functools
import sys

from tensorflow.python.distribute import merge_call_interim

from tfdtape import apply_checks
from tfdtape import boundary
from tfdtape import compat
from tfdtape import component_totals
from tfdtape import resolution
from tfdtape import workers

ATTRIBUTE = "maybe_merge_call"
_SYMBOL = apply_checks.MERGE_CALL_SYMBOL
PARAMETERS = ("fn", "strategy", "args", "kwargs")


def modules_holding(is_wanted):
    """TensorFlow's defining module, then every other loaded module whose own
    namespace holds a `maybe_merge_call` for which `is_wanted` is true."""
    found = [merge_call_interim]
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if (module is not merge_call_interim and type(namespace) is dict and
                ATTRIBUTE in namespace and is_wanted(namespace[ATTRIBUTE])):
            found.append(module)
    return found


def _first_variable(args):
    """The first distributed variable an optimizer's apply is given (its
    `grads_and_vars`' first, or its variables' first), or None: enough to
    tell whose variables they are, without walking them all on every step."""
    first = args[0] if args else None
    if not isinstance(first, (list, tuple)) or not first:
        return None
    item = first[0]
    if isinstance(item, (list, tuple)) and len(item) == 2:
        item = item[1]
    return item if resolution.is_distributed_variable(item) else None


def make_maybe_merge_call(original):
    """Returns a `maybe_merge_call` that, in cross-replica context, calls `fn`
    with the current strategy instead of failing in `merge_call`."""

    @functools.wraps(original)
    def maybe_merge_call(fn, strategy, *args, **kwargs):
        current, replica_context = (
            compat.strategy_context.get_strategy_and_replica_context())
        if (replica_context is not None or
                merge_call_interim.strategy_supports_no_merge_call()):
            if not compat.strategy_context.has_strategy() and strategy is not None:
                # An apply with no scope around it: `fn` updates every copy.
                first = _first_variable(args)
                if first is not None:
                    apply_checks.check_strategies(strategy, current, [first])
                if workers.in_multi_worker_mode(strategy):
                    args, kwargs = apply_checks.check_apply(strategy, args, kwargs)
            return original(fn, strategy, *args, **kwargs)
        with boundary.translated("applying in cross-replica context", _SYMBOL):
            apply_checks.check_no_per_replica_values(args, kwargs)
            apply_checks.check_strategies(
                strategy, current, apply_checks.distributed_variables((args, kwargs)))
            if workers.in_multi_worker_mode(current):
                args, kwargs = apply_checks.check_apply(current, args, kwargs)
            args, kwargs = component_totals.per_device((args, kwargs))
        return fn(current, *args, **kwargs)

    return maybe_merge_call
