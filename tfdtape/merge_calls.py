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
(`tfdtape.worker_agreement.check_apply`), and a value that differs between
workers is refused on every worker. A call given `PerReplica` values
(gradients returned from `strategy.run`) is refused: applied in
cross-replica context, each replica's copy would get its own value.

TensorFlow exports `maybe_merge_call` from several API modules (`tf.__internal__`
and `tf.compat.v2.__internal__` are separate module objects, and tf_keras
uses the latter); `modules_holding` finds every loaded module that holds
it, from the modules' own namespaces (no attribute lookup that would make a
lazily loaded module import).
"""

import sys

from tensorflow.python.distribute import merge_call_interim
from tensorflow.python.distribute import values
from tensorflow.python.util import nest

from tfdtape import compat
from tfdtape import component_totals
from tfdtape import cross_replica_reads
from tfdtape import errors
from tfdtape import events
from tfdtape import worker_agreement

ATTRIBUTE = "maybe_merge_call"
PARAMETERS = ("fn", "strategy", "args", "kwargs")
_SYMBOL = "tf.__internal__.distribute.interim.maybe_merge_call"


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


def make_maybe_merge_call(original):
    """Returns a `maybe_merge_call` that, in cross-replica context, calls `fn`
    with the current strategy instead of failing in `merge_call`."""

    def maybe_merge_call(fn, strategy, *args, **kwargs):
        current, replica_context = (
            compat.strategy_context.get_strategy_and_replica_context())
        if (replica_context is not None or
                merge_call_interim.strategy_supports_no_merge_call()):
            if (not compat.strategy_context.has_strategy() and strategy is not None and
                    cross_replica_reads.in_multi_worker_mode(strategy)):
                # An apply with no scope around it: `fn` updates every copy.
                args, kwargs = worker_agreement.check_apply(strategy, args, kwargs)
            return original(fn, strategy, *args, **kwargs)
        check_no_per_replica_values(args, kwargs)
        if cross_replica_reads.in_multi_worker_mode(current):
            args, kwargs = worker_agreement.check_apply(current, args, kwargs)
        args, kwargs = component_totals.per_device((args, kwargs))
        return fn(current, *args, **kwargs)

    maybe_merge_call.__doc__ = original.__doc__
    return maybe_merge_call


def check_no_per_replica_values(args, kwargs, symbol=_SYMBOL):
    """Raises ValueError if the arguments hold PerReplica values: applied in
    cross-replica context, each replica's copy would get its own value, and
    the replicas would drift apart (in replica context `merge_call` would
    have all-reduced them)."""
    found = [value for value in nest.flatten((args, kwargs))
             if isinstance(value, values.PerReplica)]
    if found:
        raise events.refused(ValueError(errors.message(
            "cannot apply per-replica values in cross-replica context", symbol,
            "values the same for every replica, such as the gradient of a tape "
            "around strategy.run, or values reduced with strategy.reduce",
            f"{len(found)} PerReplica value{'' if len(found) == 1 else 's'} "
            "(what strategy.run returns), which would update each replica's "
            "copy with its own value and let the replicas drift apart",
            "Apply inside the function you pass to strategy.run (the optimizer "
            "all-reduces there), or reduce the values first")))


def check_single_worker(strategy, symbol, what):
    """Raises ValueError if `strategy` spans several workers.

    Args:
        strategy: the strategy of the cross-replica computation.
        symbol: the API the user called, named in the message.
        what: what cannot be done, e.g. "cannot apply gradients".
    """
    if not strategy.extended._in_multi_worker_mode():
        return
    raise events.refused(ValueError(errors.message(
        f"{what} outside strategy.run under several workers", symbol,
        "a call inside strategy.run, or a strategy of one worker",
        f"a call outside strategy.run under a {type(strategy).__name__} in "
        "multi-worker mode (MultiWorkerMirroredStrategy), where a gradient "
        "covers this worker's replicas only and the workers would drift apart",
        "Compute and apply the gradients inside strategy.run, where they are "
        "all-reduced across workers")))
