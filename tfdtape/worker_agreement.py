"""Whether tensors are the same on every worker of a strategy of several.

Each tensor's fingerprint (two float64 sums: of its elements, and of its
elements weighted by position; of an `IndexedSlices`, of its values and
indices) is computed on each worker, and the fingerprints are gathered from
every worker through the strategy's own collectives (`strategy.gather`):
one small collective for all of them. Every worker then sees the same
table, so every worker takes the same decision. Equal tensors have equal
fingerprints; tensors that differ give the same two sums only by a
coincidence of rounding.

`agreement` answers for a list of tensors; `checked` lets them through only
once they agree. `tfdtape.apply_checks.check_apply` uses it to let an apply
in cross-replica context through only with values the same on every worker
(an apply updates each worker's copies with what that worker holds), and
`tfdtape.worker_totals` to count a term outside the replicas once.
"""

from tensorflow.python.distribute import values as values_lib
from tensorflow.python.eager import context
from tensorflow.python.framework import dtypes
from tensorflow.python.framework import indexed_slices
from tensorflow.python.framework import ops
from tensorflow.python.ops import array_ops
from tensorflow.python.ops import math_ops
from tensorflow.python.util import nest

from tfdtape import compat


def agreement(strategy, tensors):
    """For each of `tensors` (dense or IndexedSlices), whether it is the same
    on every worker of `strategy`: a NumPy bool array eagerly, a bool
    tensor in a graph."""
    with compat.stop_recording(), strategy.scope():
        prints = compat.stack([_fingerprint(tensor) for tensor in tensors])
        copies = []
        for device in strategy.extended.worker_devices:
            with ops.device(device):
                copies.append(array_ops.identity(prints))
        gathered = strategy.gather(values_lib.PerReplica(tuple(copies)), axis=0)
        rows = array_ops.reshape(gathered, (-1, len(tensors), prints.shape[-1]))
        agree = math_ops.reduce_all(math_ops.equal(rows, rows[:1]), axis=[0, 2])
    return agree.numpy() if context.executing_eagerly() else agree


def _fingerprint(tensor):
    if isinstance(tensor, indexed_slices.IndexedSlices):
        return array_ops.concat([_sums(tensor.values), _sums(tensor.indices)], axis=0)
    sums = _sums(tensor)
    return array_ops.concat([sums, sums], axis=0)


def _sums(tensor):
    flat = math_ops.cast(array_ops.reshape(ops.convert_to_tensor(tensor), (-1,)),
                         dtypes.float64)
    ramp = math_ops.cast(math_ops.range(1, array_ops.size(flat) + 1), dtypes.float64)
    return compat.stack([math_ops.reduce_sum(flat), math_ops.reduce_sum(flat * ramp)])


def checked(strategy, tensors, refusal):
    """`tensors` once they are known to be the same on every worker.

    Eagerly raises `refusal(index)` (an exception) for the first that is
    not; in a graph returns them through assertions that raise
    InvalidArgumentError with that text when they run, so that what uses
    them waits for the check.
    """
    agree = agreement(strategy, tensors)
    if context.executing_eagerly():
        for index, same in enumerate(agree):
            if not same:
                raise refusal(index)
        return list(tensors)
    asserts = [compat.graph_assert(agree[index], [str(refusal(index))])
               for index in range(len(tensors))]
    with ops.control_dependencies(asserts):
        return [nest.map_structure(array_ops.identity, tensor, expand_composites=True)
                for tensor in tensors]
