"""Total derivatives across the workers of a MultiWorkerMirroredStrategy.

Under a strategy of several workers a tape on one worker records that
worker's replicas only. Outside replica context the gradient of one of the
strategy's distributed variables is the gradient of the whole job: the SUM
across workers of each worker's share, all-reduced through the strategy's
own collectives (`strategy.extended.batch_reduce_to`: its group key,
packing and timeouts), every source of one `tape.gradient` call in one
batch, in the order given. Every worker gets the same bytes.

A worker's share of a source is the sum of the gradients with respect to
its local components (what its replicas, and its reads of the components,
contributed) and what the reads outside the replicas contributed
(`tfdtape.cross_replica_reads`: a term every worker computes alike, such as
an L2 penalty added to the reduced loss). The latter must count once, as
one machine counts it: its fingerprints (two sums) are gathered from every
worker first, and where they differ the gradient raises `ValueError` on
every worker alike; where they agree, each worker adds 1/W of it to what it
all-reduces (W workers), so the all-reduce adds it up once.

Eagerly, what took part on each worker (how many of its replicas have a
dense or a sparse gradient, and whether it has a term outside the
replicas) is all-reduced too, packed with the dense gradients into one
collective, so that every worker decides alike: a source that took part
on some workers only gets zeros from the others, one that took part
nowhere is None on every worker (zeros with `unconnected_gradients=ZERO`),
and a term outside the replicas that only some workers have is refused on
every worker. Each source is reduced in the form one process gives it
(`_form`: `IndexedSlices`, rows concatenated, where only IndexedSlices took
part; else dense), the form it took the last time (`_learned`, the same on
every worker), redone where the counts call for another. In a
`tf.function` all of this is the trace's, the same on every worker.

Refused with `ValueError`, raised by every worker alike (the conditions
are the program's, the same on every worker): another tape recording (its
gradient would go through the all-reduce: second order), the gradient
taken inside a control-flow body or what `jacobian` vectorizes, and a
source also read by a route that cannot be told apart from its replicas'
reads (`cross_replica_reads.direct_read`).
"""

import dataclasses
import typing
import weakref

import numpy as np
from tensorflow.python.distribute import reduce_util
from tensorflow.python.distribute import values as values_lib
from tensorflow.python.eager import context
from tensorflow.python.eager import def_function
from tensorflow.python.framework import constant_op
from tensorflow.python.framework import dtypes
from tensorflow.python.framework import indexed_slices
from tensorflow.python.framework import ops
from tensorflow.python.ops import array_ops
from tensorflow.python.ops import math_ops

from tfdtape import compat
from tfdtape import component_totals
from tfdtape import cross_replica_reads
from tfdtape import errors
from tfdtape import events
from tfdtape import graph_scopes
from tfdtape import process_state
from tfdtape import spanning_tapes
from tfdtape import worker_agreement

_SYMBOL = "tf.GradientTape.gradient"


def check_may_reduce(tape, variables):
    """Raises ValueError if the totals of `variables` (distributed variables
    of a strategy of several workers, sources of `tape`'s gradient) cannot
    be all-reduced exactly here, before anything is differentiated."""
    for variable in variables:
        route = cross_replica_reads.direct_read(tape, variable)
        if route is not None:
            raise _refusal(
                f"cannot take the gradient of {variable.name!r} across workers",
                f"{variable.name!r} also read outside the replicas by {route}, "
                "which tfdtape cannot tell from the replicas' reads and whose "
                "term would count once per worker",
                "Compute the term inside the function you pass to strategy.run "
                "(tf.nn.scale_regularization_loss), or read the variable inside "
                "strategy.scope(), outside control flow, with "
                "tf.convert_to_tensor(v) or v.read_value()")
    others = [other for other, _ in spanning_tapes.tapes_pushed_here()
              if other is not tape and other._tape is not None]
    if others:
        raise _refusal(
            "cannot take a gradient across workers while another tape records",
            "another tape recording, which would differentiate the all-reduce "
            "across workers (a second-order gradient)",
            "Take second-order gradients inside the function you pass to "
            "strategy.run, or with a strategy of one worker")
    if not graph_scopes.runs_once_here():
        raise _refusal(
            "cannot take a gradient across workers inside control flow",
            "tape.gradient inside a tf.cond branch, a loop body or what "
            "jacobian and tf.vectorized_map vectorize, where the all-reduce "
            "across workers could run other than once on every worker",
            "Take the gradient outside control flow (for a Jacobian, inside "
            "the function you pass to strategy.run)")


def _refusal(what, found, remedy):
    return events.refused(ValueError(errors.message(
        f"{what} (MultiWorkerMirroredStrategy)", _SYMBOL,
        "a gradient whose share on each worker can be all-reduced once, exactly",
        found, remedy)))


@dataclasses.dataclass(frozen=True)
class Source:
    """One source of a `tape.gradient` call, as this worker holds it.

    Attributes:
        variable: the distributed variable (of a strategy of several workers).
        parts: its local components' gradients (None where one took no part).
        outside: what the reads outside the replicas contributed, or None.
    """
    variable: object
    parts: tuple
    outside: object = None


class _Counts(typing.NamedTuple):
    """What took part in a source's gradient on a worker (summed over the
    workers once all-reduced): replicas with a dense gradient, replicas with
    a sparse one, and whether a term outside the replicas did (0 or 1)."""
    dense: float
    sparse: float
    outside: float


def reduce(strategy, sources):
    """The totals of `sources` (`Source`s, in the order given) across the
    workers of `strategy`, a strategy of several workers; None for a source
    that took part on no worker."""
    with strategy.scope():  # Also where the gradient is taken with no scope.
        return _reduce(strategy, list(sources))


def _reduce(strategy, sources):
    if context.executing_eagerly():
        return _reduce_eagerly(strategy, sources)
    plans = [_form(_counts(source)) for source in sources]
    sources = _outside_terms_checked(strategy, sources, plans)
    planned = [(source, plan) for source, plan in zip(sources, plans) if plan is not None]
    reduced = _all_reduce(strategy, [_share(strategy, source, plan) for source, plan in planned],
                          [source.variable for source, _ in planned])
    return [None if plan is None else component_totals.here(next(reduced))
            for plan in plans]


def _reduce_eagerly(strategy, sources):
    """Eagerly, what took part on each worker (`_counts`) is summed over
    the workers with the gradients, packed with them (`_packed`), and
    each source is reduced in the form those counts call for (`_form`):
    the form it took the last time, remembered alike on every worker, and,
    where that is not the one called for now, reduced again in that one
    (the first time, the counts go first, alone)."""
    workers = strategy.extended._num_workers
    counts = np.array([_counts(source) for source in sources],
                      np.float32).reshape(-1, len(_Counts._fields))
    remembered = [_learned.get(id(source.variable), (None, None))[1] for source in sources]
    if None in remembered:
        _, summed = _packed(strategy, sources, [None] * len(sources), counts)
        forms = [_form(_Counts(*row)) for row in summed]
        reduced, _ = _packed(strategy, sources, forms)
    else:
        reduced, summed = _packed(strategy, sources, remembered, counts)
        forms = [_form(_Counts(*row)) for row in summed]
        again = [form if form not in (None, given) else None
                 for form, given in zip(forms, remembered)]
        if any(again):
            for index, value in enumerate(_packed(strategy, sources, again)[0]):
                if again[index] is not None:
                    reduced[index] = value
    totals = []
    for source, row, form, value in zip(sources, summed, forms, reduced):
        if 0 < _Counts(*row).outside < workers:
            raise _differs(source.variable)
        _learn(source.variable, form or "dense")
        totals.append(None if form is None else component_totals.here(value))
    checked = [source for source, total in zip(sources, totals)
               if source.outside is not None and total is not None]
    if checked:
        worker_agreement.checked(
            strategy, [source.outside for source in checked],
            lambda position: _differs(checked[position].variable))
    return totals


def _form(counts):
    """How a source's total is formed from its counts summed over the
    workers, as one process forms it (`component_totals.sum_components`):
    None where nothing took part, "sparse" where only IndexedSlices did
    (rows concatenated), else "dense". Some workers' term outside the
    replicas but not all's is refused after the reduction."""
    if counts.dense + counts.sparse + counts.outside == 0:
        return None
    return "sparse" if counts.dense == 0 and counts.outside == 0 else "dense"


def _packed(strategy, sources, forms, counts=None):
    """Eagerly: ([total or None] of `sources`, each reduced in its form (None:
    not reduced), and `counts` summed over the workers, or None), through
    one `batch_reduce_to`.

    TensorFlow launches one collective per tensor eagerly; here the dense
    shares of each dtype (and the counts, with the first) are packed into
    one flat tensor per replica, as its graphs pack them, so that the
    reduction costs one launch, not one per variable. IndexedSlices go as
    they are (each an all-gather of rows)."""
    devices = strategy.extended.worker_devices
    groups = {}  # dtype -> [index of a dense share]
    for index, form in enumerate(forms):
        if form == "dense":
            groups.setdefault(sources[index].variable.dtype.base_dtype, []).append(index)
    shares = {index: _share(strategy, sources[index], form)
              for index, form in enumerate(forms) if form is not None}
    packs = []  # (dense indices, with the counts, PerReplica of flat tensors)
    for position, indices in enumerate(groups.values()):
        packs.append((indices, counts is not None and position == 0,
                      _flat(devices, [shares[i] for i in indices],
                            counts if position == 0 else None)))
    if counts is not None and not groups:  # Nothing dense: the counts alone.
        packs.append(([], True, _flat(devices, [], counts)))
    sparse = [index for index, form in enumerate(forms) if form == "sparse"]
    reduced = list(_all_reduce(
        strategy, [pack for _, _, pack in packs] + [shares[i] for i in sparse],
        [pack for _, _, pack in packs] + [sources[i].variable for i in sparse]))
    found = [None] * len(sources)
    summed = None
    for (indices, with_counts, _), value in zip(packs, reduced):
        copies = strategy.experimental_local_results(value)
        sizes = [sources[i].variable.shape.num_elements() for i in indices]
        if with_counts:
            summed = copies[0][sum(sizes):].numpy().astype(np.float64).reshape(counts.shape)
        pieces = [array_ops.split(copy[:sum(sizes)], sizes) if sizes else []
                  for copy in copies]
        for position, index in enumerate(indices):
            shaped = [array_ops.reshape(piece[position], sources[index].variable.shape)
                      for piece in pieces]
            found[index] = shaped[0] if len(shaped) == 1 else values_lib.Mirrored(tuple(shaped))
    for index, value in zip(sparse, reduced[len(packs):]):
        found[index] = value
    return found, summed


def _flat(devices, shares, counts):
    """A PerReplica of each replica's dense `shares` flattened and
    concatenated, `counts` appended to the first replica's and zeros of
    their size to the others'."""
    parts = []
    for index, device in enumerate(devices):
        with ops.device(device):
            pieces = [array_ops.reshape(share.values[index], [-1]) for share in shares]
            if counts is not None:
                tail = counts.reshape(-1) if index == 0 else np.zeros(counts.size, np.float32)
                dtype = shares[0].values[index].dtype if shares else dtypes.float32
                pieces.append(math_ops.cast(constant_op.constant(tail), dtype))
            parts.append(pieces[0] if len(pieces) == 1 else array_ops.concat(pieces, axis=0))
    return values_lib.PerReplica(tuple(parts))


# Kept across importlib.reload: every worker's memory stays alike.
_learned = process_state.kept(globals(), "_learned", dict)
"""id(variable) -> (weak reference to it, the form its total took the last
time: "sparse" or "dense"): the same on every worker, since it is decided
from every worker's counts."""


def _learn(variable, form):
    key = id(variable)
    try:
        reference = weakref.ref(variable, lambda _: _learned.pop(key, None))
    except TypeError:  # Not weakly referable: the counts go first each time.
        return
    _learned[key] = (reference, form)


def _counts(source):
    """The `_Counts` of `source` on this worker."""
    return _Counts(sum(g is not None and not _is_sparse(g) for g in source.parts),
                   sum(_is_sparse(g) for g in source.parts),
                   float(source.outside is not None))


def _share(strategy, source, plan):
    """This worker's share of `source`'s total: a PerReplica of its
    components' gradients, dense (zeros where one took no part) or sparse
    (IndexedSlices with int64 indices, none where one took no part), with
    1/W of the term outside the replicas added to the first."""
    workers = strategy.extended._num_workers
    variable = source.variable
    components = strategy.experimental_local_results(variable)
    make = _dense if plan == "dense" else _sparse
    parts = [make(part, variable, component)
             for part, component in zip(source.parts, components)]
    if source.outside is not None:
        with ops.device(components[0].device):
            term = ops.convert_to_tensor(source.outside) / workers
            parts[0] = (parts[0] + term if plan == "dense" else
                        _concat_rows(parts[0], _sparse(term, variable, components[0])))
    return values_lib.PerReplica(tuple(parts))


def _all_reduce(strategy, shares, destinations):
    """An iterator over the SUMs across every worker of `shares`: eagerly
    inside a `tf.function` where some are IndexedSlices and TensorFlow
    gathers them in graphs only (`compat.EAGER_SPARSE_ALL_REDUCE`), as its
    own eager `strategy.gather` does."""
    if not shares:
        return iter(())
    pairs = list(zip(shares, destinations))

    def reduced():
        return strategy.extended.batch_reduce_to(reduce_util.ReduceOp.SUM, pairs)

    with compat.stop_recording():
        if (context.executing_eagerly() and not compat.EAGER_SPARSE_ALL_REDUCE and
                any(_is_sparse(value) for share in shares for value in share.values)):
            return iter(_traced(strategy, reduced))
        return iter(reduced())


def _traced(strategy, reduced):
    """What `reduced()` returns, run in a `tf.function` traced for this call
    (each result's local copies come out; a Mirrored is rebuilt of them)."""
    copies = def_function.function(lambda: [
        tuple(strategy.experimental_local_results(value)) for value in reduced()])()
    return [values[0] if len(values) == 1 else values_lib.Mirrored(values)
            for values in copies]


def _dense(part, variable, component):
    """A component's gradient as a dense tensor on its device (zeros where
    it took no part)."""
    if part is None:
        with ops.device(component.device):
            return array_ops.zeros(variable.shape, variable.dtype)
    return ops.convert_to_tensor(part)


def _sparse(part, variable, component):
    """A component's gradient as IndexedSlices with int64 indices on its
    device (every row of a dense one; no row where it took no part)."""
    if isinstance(part, indexed_slices.IndexedSlices) and part.indices.dtype == dtypes.int64:
        return part
    shape = variable.shape
    with ops.device(component.device):
        if part is None:
            values = array_ops.zeros([0] + shape[1:].as_list(), variable.dtype)
            indices = array_ops.zeros([0], dtypes.int64)
        elif isinstance(part, indexed_slices.IndexedSlices):
            values, indices = part.values, math_ops.cast(part.indices, dtypes.int64)
        else:
            values = ops.convert_to_tensor(part)
            indices = math_ops.range(shape[0], dtype=dtypes.int64)
        return indexed_slices.IndexedSlices(
            values, indices, constant_op.constant(shape.as_list(), dtypes.int64))


def _concat_rows(one, other):
    return indexed_slices.IndexedSlices(
        array_ops.concat([one.values, other.values], axis=0),
        array_ops.concat([one.indices, other.indices], axis=0), one.dense_shape)


def _is_sparse(gradient):
    return isinstance(gradient, indexed_slices.IndexedSlices)


def _outside_terms_checked(strategy, sources, plans):
    """`sources` with what the reads outside the replicas contributed checked
    to be the same on every worker (`worker_agreement.checked`: in a graph
    an assertion the all-reduce waits for)."""
    outside = [index for index, source in enumerate(sources)
               if source.outside is not None and plans[index] is not None]
    if not outside:
        return sources
    terms = worker_agreement.checked(
        strategy, [sources[index].outside for index in outside],
        lambda position: _differs(sources[outside[position]].variable))
    sources = list(sources)
    for index, term in zip(outside, terms):
        sources[index] = dataclasses.replace(sources[index], outside=term)
    return sources


def _differs(variable):
    return _refusal(
        f"cannot count a term outside the replicas once for {variable.name!r}",
        f"a term read from {variable.name!r} outside strategy.run whose gradient "
        "differs between workers (it depends on what one worker computed alone, "
        "such as its local results), so no one count of it is the job's",
        "Compute the term inside the function you pass to strategy.run "
        "(tf.nn.scale_regularization_loss), or reduce what it depends on with "
        "strategy.reduce first")
