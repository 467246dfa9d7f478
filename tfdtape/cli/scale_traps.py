"""A way a program with a tape around `strategy.run` trains silently at
the wrong gradient scale, noticed for `python -m tfdtape run`'s report.

**The MEAN trap.** `tf.nn.compute_average_loss` divides by the global
batch size; `strategy.reduce("MEAN", ...)` of its results divides by the
number of replicas again: the loss and its gradient are 1/N of the intended
(TensorFlow's tutorial reduces them with SUM; a MEAN belongs with
per-replica means).

Only while a sink is open (`events.active`) and inside
`observe_average_losses()` (the run command's lifetime): the results of
`compute_average_loss` are noted, weakly, where they are made; each
reduction the library reports to the event bus (`events.ReductionEvent`,
from tfdtape's `reduce_to`) is looked at for them (`_check_mean`), and a
MEAN of them under a tape around strategy.run reported as an
`events.WarningEvent`. A SUM of such losses and a MEAN of anything else are
not warned about. (A total over the replicas applied inside strategy.run,
the other trap, is refused: `tfdtape.apply_checks.check_no_total`.)
"""

import contextlib
import functools
import sys
import weakref

from tensorflow.python.distribute import reduce_util
from tensorflow.python.distribute import values as values_lib
from tensorflow.python.util import nest

from tfdtape import events
from tfdtape import process_state
from tfdtape import targets

MEAN_OF_AVERAGE_LOSSES = "MEAN of compute_average_loss"
"""The warning kind this module reports."""

_AVERAGE_LOSS = "average loss"

# Kept across importlib.reload: what was noted stays noted.
_noted = process_state.kept(globals(), "_noted", dict)
"""id(tensor) -> (weak reference to it, what it is: _AVERAGE_LOSS); an
entry goes with its tensor."""

AVERAGE_LOSS_FUNCTION = "compute_average_loss"
_AVERAGE_LOSS_MODULES = ("tensorflow.python.ops.nn_impl_distribute",  # 2.13+
                         "tensorflow.python.ops.nn_impl")              # 2.12
"""Where TensorFlow defines `tf.nn.compute_average_loss`."""
_PARAMETERS = ("per_example_loss", "sample_weight", "global_batch_size")


def _note(structure, kind):
    for value in nest.flatten(structure):
        key = id(value)
        try:
            reference = weakref.ref(value, lambda _, key=key: _noted.pop(key, None))
        except TypeError:  # None, or not weakly referable
            continue
        _noted[key] = (reference, kind)


def _kind(value):
    found = _noted.get(id(value))
    return found[1] if found is not None and found[0]() is value else None


def _parts(value):
    """`value`'s tensors, a distributed value's components among them."""
    parts = []
    for item in nest.flatten(value):
        if isinstance(item, values_lib.DistributedValues):
            parts.extend(item.values)
        else:
            parts.append(item)
    return parts


def _check_mean(reduction):
    """Reports MEAN_OF_AVERAGE_LOSSES when `reduction` (an
    events.ReductionEvent) is a MEAN, under a tape recording around a
    strategy.run, of a result of compute_average_loss."""
    if not (_is_mean(reduction.reduce_op) and _noted and reduction.spanning):
        return
    if any(_kind(part) == _AVERAGE_LOSS for part in _parts(reduction.value)):
        events.warn(MEAN_OF_AVERAGE_LOSSES, reduction.frame)


def _is_mean(reduce_op):
    if isinstance(reduce_op, str):
        return reduce_op.upper() == "MEAN"
    return reduce_op == reduce_util.ReduceOp.MEAN


def _divides_by_local_batch(args, kwargs):
    """Whether a `compute_average_loss(per_example_loss, sample_weight,
    global_batch_size)` call was given its per-example losses' own (static)
    batch size: a per-replica mean, which a MEAN reduces rightly."""
    losses = args[0] if args else kwargs.get("per_example_loss")
    given = args[2] if len(args) > 2 else kwargs.get("global_batch_size")
    shape = getattr(losses, "shape", None)
    local = shape[0] if shape is not None and shape.rank else None
    return isinstance(given, int) and local is not None and given == local


def _observe_average_loss(original):
    """`compute_average_loss` noting its results while a sink is open."""

    @functools.wraps(original)
    def compute_average_loss(*args, **kwargs):
        loss = original(*args, **kwargs)
        if events.active and not _divides_by_local_batch(args, kwargs):
            _note(loss, _AVERAGE_LOSS)
        return loss

    return compute_average_loss


def average_loss_targets():
    """A target for every loaded module that holds TensorFlow's
    `tf.nn.compute_average_loss` (its API modules hold the same function);
    none in a TensorFlow that defines it elsewhere."""
    defined = [vars(module)[AVERAGE_LOSS_FUNCTION]
               for module in map(sys.modules.get, _AVERAGE_LOSS_MODULES)
               if module is not None and AVERAGE_LOSS_FUNCTION in vars(module)]
    if not defined:
        return []
    original = defined[0]
    # TensorFlow's function is a dispatch wrapper: its code runs there.
    runs_in = sys.modules.get(original.__globals__.get("__name__"))
    holders = [module for module in list(sys.modules.values())
               if type(getattr(module, "__dict__", None)) is dict and
               module.__dict__.get(AVERAGE_LOSS_FUNCTION) is original]
    return [targets.PatchTarget(module, AVERAGE_LOSS_FUNCTION, _PARAMETERS,
                                _observe_average_loss, defined_in=runs_in)
            for module in holders]


@contextlib.contextmanager
def observe_average_losses():
    """Inside the block, `tf.nn.compute_average_loss` (in every loaded module
    that holds it) notes its results while a sink is open, and reductions
    are checked for them (through `targets.scoped`: `info` names the
    targets, `uninstall()` restores them)."""
    with targets.scoped(average_loss_targets()), \
            events.listening_for_reductions(_check_mean):
        yield
