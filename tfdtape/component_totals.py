"""The total derivative of a distributed variable from its components'
gradients, and where that total is reduced.

Outside replica context a distributed source's gradient is the sum of the
gradients with respect to its local components. Where every component took
part with a dense gradient, the sum goes through the variable's strategy's
own cross-device reduction, `strategy.extended.batch_reduce_to` (the call
the tutorial step's optimizer makes: NCCL on GPUs, the strategy's packing),
all such sources of one `tape.gradient` call in one batch. It gives a
`Mirrored` value, a copy of the total on each of the variable's devices;
`tape.gradient` returns the copy on the current device (else the first),
a `tf.Tensor` as before, and remembers the others: an apply in
cross-replica context (`tfdtape.merge_calls`) hands each device's update
its own copy (`per_device`), so the step sends each gradient through the
strategy's all-reduce once, as the tutorial's does, instead of through one
device and back out to every other. A gradient the program changed before
the apply is a new tensor and is copied to the devices as TensorFlow copies
it.

Where the strategy's reduction would cost more than summing in this
process (`_sums_in_place`: every device a CPU of this host), the totals
are summed here instead: in a graph packed (`packed_totals`: each device's
gradients flattened into one tensor, the packs summed on the first device,
the sum sent back once to each device and cut there into that device's
copies, a `Mirrored` value as above), since a graph sends each tensor
between devices with a `_Send`/`_Recv` pair, and the per-variable way took
two per variable and device (docs/benchmarks.md); eagerly one `add_n` per
variable.

Otherwise the sum is taken where `tape.gradient` runs (`sum_components`):
some components unconnected, `IndexedSlices`, one component, another
strategy's scope, and wherever the total could be differentiated or run
again (a tape could record it: second order; a `tf.cond` branch, a loop
body, the body `jacobian` and `tf.vectorized_map` vectorize), since the
strategy's reduction may have no gradient and its collectives must run
once per step on every device.
"""

import typing
import weakref

from tensorflow.python import pywrap_tfe
from tensorflow.python.distribute import cross_device_ops
from tensorflow.python.distribute import mirrored_strategy
from tensorflow.python.distribute import reduce_util
from tensorflow.python.distribute import values as values_lib
from tensorflow.python.eager import context
from tensorflow.python.framework import device_spec
from tensorflow.python.framework import indexed_slices
from tensorflow.python.framework import ops
from tensorflow.python.ops import array_ops
from tensorflow.python.ops import math_ops
from tensorflow.python.util import nest

from tfdtape import compat
from tfdtape import graph_scopes
from tfdtape import process_state

# Kept across importlib.reload: totals handed out stay known.
_copies = process_state.kept(globals(), "_copies", dict)
"""Eagerly: id(total handed out) -> (weak reference to it, the Mirrored
value's copies with None in its place); an entry goes with the total."""


def sum_components(gradients):
    """Sums the gradients of one variable's components where this runs.

    None when no component is connected; IndexedSlices stay IndexedSlices
    (their rows are concatenated); a mix of sparse and dense is made dense.
    """
    present = [g for g in gradients if g is not None]
    if len(present) <= 1:
        return present[0] if present else None
    if all(isinstance(g, indexed_slices.IndexedSlices) for g in present):
        return indexed_slices.IndexedSlices(
            values=array_ops.concat([g.values for g in present], axis=0),
            indices=array_ops.concat([g.indices for g in present], axis=0),
            dense_shape=present[0].dense_shape)
    return math_ops.add_n([ops.convert_to_tensor(g) for g in present])


def reducible(variable, gradients):
    """Whether the total for `variable` (a distributed variable) from its
    components' `gradients` may go through its strategy's reduction (where
    `reduce` finds it may run and costs no more)."""
    return (len(gradients) > 1 and
            isinstance(variable.distribute_strategy.extended,
                       mirrored_strategy.MirroredExtended) and
            all(g is not None and not isinstance(g, indexed_slices.IndexedSlices)
                for g in gradients))


class _Pending(typing.NamedTuple):
    """A total `reduce` is to give: where it goes in the result, the
    variable, and its components' gradients."""
    index: int
    variable: object
    gradients: list


def _sums_in_place(strategy, pending):
    """Whether summing the totals `pending` (`_Pending`s) in this process
    (`packed_totals` in a graph, `sum_components` eagerly) costs no more
    than `strategy`'s own reduction would.

    - Where the strategy would reduce on its first device by `add_n` and
      copy out (`ReductionToOneDevice`, MirroredStrategy's default for CPUs
      on TensorFlow 2.12): the same transfers.
    - Where every device is a CPU of this host and the strategy all-reduces
      with the collectives it picked by default: host memory has no links
      to spread traffic over, and collectives cost a launch per tensor
      (eagerly through a thread pool): measured faster in place at every
      model size benchmarks/spanning_step.py tries, in a graph once packed
      (docs/benchmarks.md).

    A reduction the program chose, and every GPU, stays the strategy's.
    """
    extended = strategy.extended
    gradients = pending[0].gradients
    try:
        chosen = extended._get_cross_device_ops(values_lib.PerReplica(tuple(gradients)))
        default = extended._cross_device_ops is getattr(extended, "_collective_ops", None)
    except AttributeError:  # Another TensorFlow: reduce through the strategy.
        return False
    if type(chosen) is cross_device_ops.ReductionToOneDevice:
        return chosen.reduce_to_device is None and chosen.accumulation_fn is math_ops.add_n
    return default and all(
        device_spec.DeviceSpecV2.from_string(device).device_type == "CPU"
        for device in extended.worker_devices)


def _may_reduce_here(strategy):
    """Whether a reduction by `strategy` may run here: in its scope or no
    strategy's, and where nothing would differentiate it or run it more or
    less than once (no tape that could record; `graph_scopes.runs_once_here`)."""
    strategies = compat.strategy_context
    if strategies.has_strategy() and strategies.get_strategy() is not strategy:
        return False
    if not pywrap_tfe.TFE_Py_TapeSetIsEmpty():
        return False
    return graph_scopes.runs_once_here()


def reduce(pairs):
    """The totals of `pairs`, (distributed variable, its components'
    gradients) each, `reducible`: reduced by the variables' strategies, one
    batch per strategy, or where that costs more (`_sums_in_place`) summed
    in this process, in a graph packed (`packed_totals`), the copy on the
    current device of each handed out and the others remembered (`here`);
    or summed one by one where `tape.gradient` runs, where no reduction may
    run (`_may_reduce_here`) or eagerly in place."""
    by_strategy = {}
    for index, (variable, gradients) in enumerate(pairs):
        strategy = variable.distribute_strategy
        by_strategy.setdefault(id(strategy), (strategy, []))[1].append(
            _Pending(index, variable, gradients))
    totals = [None] * len(pairs)
    for strategy, pending in by_strategy.values():
        if not _may_reduce_here(strategy):
            mirrored = None
        elif not _sums_in_place(strategy, pending):
            mirrored = strategy.extended.batch_reduce_to(
                reduce_util.ReduceOp.SUM,
                [(values_lib.PerReplica(tuple(gradients)), variable)
                 for _, variable, gradients in pending])
        elif not context.executing_eagerly():
            mirrored = packed_totals([gradients for _, _, gradients in pending])
        else:
            mirrored = None
        for position, (index, _, gradients) in enumerate(pending):
            if mirrored is None or mirrored[position] is None:
                totals[index] = sum_components(gradients)
            else:
                totals[index] = here(mirrored[position])
    return totals


TOTALS_SCOPE = "packed_totals"
"""The name scope of the ops `packed_totals` adds to a graph."""


def packed_totals(gradients):
    """In a graph: the totals of several variables' components' dense
    `gradients` (one list per variable, the components in device order),
    each a `Mirrored` value with a copy on each component's device, summed
    through one pack per device (per dtype and set of devices).

    Each device's gradients are flattened and concatenated where they were
    computed, the packs summed by one `add_n` on the first device, and the
    sum cut back into each variable's shape on every device: one transfer
    of the pack to the first device and one back per other device, instead
    of two per variable. None for a gradient whose shape is not fully known
    at trace time (summed alone by the caller).
    """
    groups = {}
    for position, parts in enumerate(gradients):
        if parts[0].shape.is_fully_defined():
            key = (parts[0].dtype, tuple(part.device for part in parts))
            groups.setdefault(key, []).append(position)
    totals = [None] * len(gradients)
    with ops.name_scope(TOTALS_SCOPE):
        for (_, devices), positions in groups.items():
            shapes = [gradients[position][0].shape for position in positions]
            packs = []
            for component, device in enumerate(devices):
                with ops.device(device):
                    packs.append(array_ops.concat(
                        [array_ops.reshape(gradients[position][component], [-1])
                         for position in positions], axis=0))
            with ops.device(devices[0]):
                packed_sum = math_ops.add_n(packs)
            copies = []  # per device: each variable's total
            for device in devices:
                with ops.device(device):
                    pieces = array_ops.split(
                        packed_sum, [shape.num_elements() for shape in shapes])
                    copies.append([array_ops.reshape(piece, shape)
                                   for piece, shape in zip(pieces, shapes)])
            for slot, position in enumerate(positions):
                totals[position] = values_lib.Mirrored(
                    tuple(on_device[slot] for on_device in copies))
    return totals


def _memo():
    """Where the totals handed out here are remembered: eagerly, this
    module's `_copies`; in a graph, a dictionary on the graph, which goes
    with it (its entries hold the graph's tensors)."""
    if context.executing_eagerly():
        return _copies
    graph = ops.get_default_graph()
    memo = getattr(graph, _GRAPH_MEMO, None)
    if memo is None:
        memo = {}
        setattr(graph, _GRAPH_MEMO, memo)
    return memo


_GRAPH_MEMO = "_tfdtape_reduced_totals"


def here(mirrored):
    """The copy of a Mirrored total on the current device, else the first;
    the others are remembered for the apply, for as long as that copy lives
    (the entry holds it weakly, the others in its place). A total of one
    device (what a reduction gives where it has one destination) is its own
    copy."""
    if not isinstance(mirrored, values_lib.DistributedValues):
        mirrored = values_lib.Mirrored((mirrored,))
    total = mirrored._get_on_device_or_primary()
    memo = _memo()
    key = id(total)
    try:
        reference = weakref.ref(total, lambda _: memo.pop(key, None))
    except TypeError:  # Not weakly referable: no copies handed on.
        return total
    others = tuple(None if value is total else value for value in mirrored.values)
    memo[key] = (reference, others)
    return total


_IDENTITIES = ("Identity", "IdentityN")


def is_total(value):
    """Whether `value` is a total `reduce` handed out (here: eagerly, or in
    the current graph) that is still alive; in a graph also an identity of
    one (Keras passes gradients through `IdentityN` there)."""
    if context.executing_eagerly():
        memo = _copies
    else:
        memo = getattr(ops.get_default_graph(), _GRAPH_MEMO, None)
        while (memo and id(value) not in memo and isinstance(value, compat.Tensor) and
               value.op.type in _IDENTITIES):
            value = value.op.inputs[value.value_index]
    found = memo.get(id(value)) if memo else None
    return found is not None and found[0]() is value


# Kept across importlib.reload: totals noted stay noted.
_over_replicas = process_state.kept(globals(), "_over_replicas",
                                   weakref.WeakValueDictionary)
"""id(tensor) -> the tensor, held weakly: every total over the replicas'
components `tape.gradient` handed out in cross-replica context (eagerly
and in graphs; across workers too)."""


def note_over_replicas(totals):
    """Notes `totals` (tensors, IndexedSlices or None), gradients of
    distributed variables summed over their components in cross-replica
    context, for `made_of_total`."""
    for total in totals:
        if isinstance(total, indexed_slices.IndexedSlices):
            total = total.values
        if isinstance(total, compat.Tensor):
            _over_replicas[id(total)] = total


def _noted(tensor):
    return _over_replicas.get(id(tensor)) is tensor


_DERIVED_DEPTH = 8
"""How many ops back `made_of_total` looks in a graph (an unscale, a clip
by global norm and Keras's identities take fewer)."""


def made_of_total(structure):
    """Whether a tensor or IndexedSlices of `structure` is a total over the
    replicas' components (`note_over_replicas`) or, in a graph, computed
    from one within `_DERIVED_DEPTH` ops (one walk for the whole
    structure). Eagerly a tensor keeps no history: only the total itself
    is recognised."""
    if not _over_replicas:
        return False
    frontier = [item.values if isinstance(item, indexed_slices.IndexedSlices) else item
                for item in nest.flatten(structure)]
    frontier = [item for item in frontier if isinstance(item, compat.Tensor)]
    if context.executing_eagerly():
        return any(map(_noted, frontier))
    captured = _captured_from_outside(ops.get_default_graph())
    seen = set()
    for _ in range(_DERIVED_DEPTH):
        following = []
        for tensor in frontier:
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            if _noted(tensor):
                return True
            outside = captured.get(id(tensor))
            if outside is not None:
                following.append(outside)
            elif not isinstance(tensor, ops.EagerTensor):  # Eager: no history.
                following.extend(tensor.op.inputs)
        frontier = following
    return False


def _captured_from_outside(graph):
    """id(placeholder) -> the tensor it captures, for `graph` and the
    graphs around it (a tf.cond branch, a loop body, a tf.function)."""
    captured = {}
    while graph is not None and hasattr(graph, "captures"):
        for external, internal in graph.captures:
            captured[id(internal)] = external
        graph = getattr(graph, "outer_graph", None)
    return captured


def per_device(structure):
    """`structure` with each total `reduce` handed out (here: eagerly, or in
    the current graph) replaced by its Mirrored value (a copy on each
    device), anything else as it is."""
    memo = (_copies if context.executing_eagerly()
            else getattr(ops.get_default_graph(), _GRAPH_MEMO, None))
    if not memo:
        return structure

    def swap(value):
        found = memo.get(id(value))
        if found is None or found[0]() is not value:
            return value
        return values_lib.Mirrored(
            tuple(value if copy is None else copy for copy in found[1]))

    return nest.map_structure(swap, structure)
