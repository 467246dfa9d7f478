"""Collectives under a tape around `strategy.run`: each collective's forward
pass, as tfdtape routes it, beside its transpose, one section per
collective (all-reduce, all-gather), after what they share.

A tape around `strategy.run` computes every replica's backward pass in one
thread, outside replica context, where no replica can issue another
collective. What communicates across replicas there must be recorded in
that thread, with a backward function that needs no replica context.

**Inside the replicas.** `ReplicaContext.all_reduce` (what synchronized
BatchNormalization and losses over every replica's values call) and
`ReplicaContext.all_gather` wrap their transfer in a `tf.custom_gradient`
whose backward pass is another collective, issued by every replica: right
for a tape inside the replica function, but not for a tape around the run
(and eagerly the transfer itself, recorded in the calling thread, has no
gradient: `LookupError`). While only tapes around the run record in its
replicas, tfdtape's versions make the transfer through `merge_call`, as
TensorFlow does, without the custom gradient: the merge_call function runs
in the calling thread, where its reduction or gather is recorded (below).
Everywhere else (a tape opened inside the replica function, `IndexedSlices`,
strategies that transfer without `merge_call`, the replicas of other
workers) TensorFlow's function runs unchanged. In the backward pass of a
tape that recorded the replicas (`tf.recompute_grad` recomputing, a custom
gradient), which runs outside them, either raises: there it would reduce
nothing. A `tf.autodiff.ForwardAccumulator` inside the replica counts as a
tape opened there (forward-mode derivatives need TensorFlow's path).

**In cross-replica context.** Two places record the transfer:
- a `merge_call` function (the one above, or the program's own) for the
  replicas of a run that only tapes around it record
  (`spanning_tapes.merging_for_spanned_replicas`); eagerly, the collectives
  of `reduce_to` and `batch_reduce_to` launch from a thread pool no tape
  records (the gradient is silently None), and in a graph
  `CollectiveReduceV2` has no gradient;
- `batch_reduce_to` and `strategy.gather` (`_gather_to`) of per-replica
  values under any recording tape in cross-replica context, outside a run's
  merge_call (`batch_reduce_to` on what `strategy.run` returned: eagerly a
  silent None; `strategy.gather`: `LookupError`, eagerly already in the
  forward pass). `reduce_to` there (what `strategy.reduce` calls, to the
  host's CPU) keeps TensorFlow's own gradient: it reduces through copies and
  `add_n`; it tells the event bus of each reduction while a sink is open
  (`events.record_reduction`).

There the transfer runs as TensorFlow's, without recording, and each of its
results is recorded as one operation whose inputs are every replica's
value: for a reduction (SUM; MEAN divides by the number of replicas) each
input gets the result's cotangent on its own device, for a gather its slice
of it (split on the cotangent's device, each slice then moved to its
input's device). The tape sums what an input gets from the results: the
transpose of an all-reduce or all-gather, exactly.

Only `PerReplica` values of dense tensors held by this process's replicas
are recorded so; variables, mirrored values and the other workers' replicas
(MultiWorkerMirroredStrategy) take TensorFlow's path. A reduction of
`IndexedSlices` (not differentiable in TensorFlow either; eagerly the
gradient was silently None) is recorded with a backward function that
raises a `ValueError` saying so.

On N devices the backward pass of an all-reduce copies each result's
cotangent from each replica's device to every other: N(N-1) transfers of
the reduced value's size, against 2(N-1) shares of it for a ring
all-reduce in the tutorial step; that of an all-gather moves each replica's
slice of each result's cotangent to its device, N(N-1) slices of the
input's size. What synchronized BatchNormalization reduces (a sum, a sum of
squares and a count per channel) is small.
"""

import functools
import sys

from tensorflow.python import pywrap_tfe
from tensorflow.python.distribute import collective_util
from tensorflow.python.distribute import distribute_lib
from tensorflow.python.distribute import reduce_util
from tensorflow.python.distribute import values
from tensorflow.python.eager import context
from tensorflow.python.framework import indexed_slices
from tensorflow.python.framework import ops
from tensorflow.python.ops import array_ops
from tensorflow.python.ops import math_ops
from tensorflow.python.util import nest

from tfdtape import apply_checks
from tfdtape import backward_placement
from tfdtape import boundary
from tfdtape import compat
from tfdtape import errors
from tfdtape import events
from tfdtape import graph_scopes
from tfdtape import spanning_tapes
from tfdtape import workers

_ALL_REDUCE = "tf.distribute.ReplicaContext.all_reduce"
_ALL_GATHER = "tf.distribute.ReplicaContext.all_gather"
_SYMBOL = "tf.distribute.ReplicaContext.all_reduce or StrategyExtended.batch_reduce_to"
_GATHER_SYMBOL = "tf.distribute.ReplicaContext.all_gather or Strategy.gather"

_RECORDING = "recording a transfer across replicas for the tape"
_ROUTING = "routing a collective through merge_call for a tape around strategy.run"

REDUCTION = "tfdtape_cross_replica_reduction"
GATHER = "tfdtape_cross_replica_gather"
"""The names the recorded transfers carry on the tape."""


# Shared: where a collective runs, and where its transfer is recorded ------


def _in_its_replica(replica_context, symbol):
    """True if `replica_context` is the current one; False where it is not
    but its strategy has one replica, whose collectives hand a value back
    as it is.

    A call outside its replica is, almost always, TensorFlow's gradient of
    a collective run by a tape that differentiates it from outside the
    replica; TensorFlow refuses it ("Need to be inside
    call_for_each_replica()", "Mismatching ReplicaContext").

    Raises:
        RuntimeError (TensorFlow's type): outside its replica, under a
            strategy of several replicas.
    """
    if compat.strategy_context.get_replica_context() is replica_context:
        return True
    if replica_context._strategy.num_replicas_in_sync == 1:
        return False
    raise events.refused(RuntimeError(errors.message(
        "cannot run a collective outside the replica it belongs to", symbol,
        "a call inside the function passed to strategy.run",
        "a call outside it, as TensorFlow's gradient of a collective makes "
        "when a tape outside the replicas differentiates it (a tape around "
        "strategy.run while a tape inside the replica function records too, "
        "an eager tape around a tf.function that runs strategy.run)",
        "Differentiate the replicas with one tape: inside the function you "
        "pass to strategy.run, or around strategy.run (on MirroredStrategy; "
        "inside the tf.function), where tfdtape differentiates collectives "
        "over every replica")))


def _transfers_in_the_calling_thread(replica_context, value, symbol):
    """Whether the transfer goes through merge_call without TensorFlow's
    custom gradient (described above).

    Raises:
        ValueError: only tapes around the run record, under a strategy of
            several workers: the backward pass of a transfer across workers
            would need every worker's cotangents.
    """
    strategy = replica_context._strategy
    if (spanning_tapes.only_spanning_tapes_record_here() and
            workers.in_multi_worker_mode(strategy)):
        raise events.refused(ValueError(errors.message(
            "cannot differentiate a collective across workers from a tape "
            "around strategy.run", symbol,
            "collectives inside the replicas of a strategy of one worker, or "
            "a tape inside the function you pass to strategy.run",
            "one under a strategy of several workers "
            "(MultiWorkerMirroredStrategy), whose backward pass would need "
            "every worker's cotangents",
            "Open the tape inside the function you pass to strategy.run (the "
            "collective then has TensorFlow's gradient)")))
    return (spanning_tapes.only_spanning_tapes_record_here() and
            strategy.extended._use_merge_call() and
            len(strategy.extended.worker_devices) == strategy.num_replicas_in_sync and
            not any(isinstance(v, indexed_slices.IndexedSlices)
                    for v in nest.flatten(value)))


def _merged(replica_context, merge_fn, value):
    """`merge_fn` over the flattened `value` of every replica, through
    `merge_call`; its results packed as `value`."""
    flat = [ops.convert_to_tensor(v) for v in nest.flatten(value)]
    results = replica_context.merge_call(merge_fn, args=tuple(flat))
    return nest.pack_sequence_as(value, list(results))


def _unrecorded(transfer, symbol):
    """What `transfer()` returns, run with no tape recording.

    Raises:
        ValueError: in a control-flow body (a `tf.cond` branch, a loop body)
            the transfer made collective ops: TensorFlow builds the gradient
            of the body from its graph, where they have none (a
            `LookupError` otherwise).
    """
    graph = ops.get_default_graph()
    inside_body = (not context.executing_eagerly() and
                   graph_scopes.in_control_flow_body(graph))
    before = len(graph.get_operations()) if inside_body else 0
    with compat.stop_recording():
        result = transfer()
    if inside_body:
        collectives = sorted({op.type for op in graph.get_operations()[before:]
                              if op.type.startswith(("Collective", "Nccl"))})
        if collectives:
            raise events.refused(ValueError(errors.message(
                "cannot differentiate a collective inside a tf.cond branch or "
                "loop body", symbol,
                "strategy.run outside control flow when a tape around it "
                "differentiates what the replicas communicate",
                f"strategy.run inside a control-flow body, whose gradient "
                f"TensorFlow builds from the body's graph, where "
                f"{', '.join(collectives)} has no gradient",
                "Call strategy.run outside the tf.cond or loop (choose between "
                "its results instead), or open the tape inside the function "
                "you pass to strategy.run")))
    return result


_DEFAULT_REPLICA_CONTEXT = getattr(distribute_lib, "_DefaultReplicaContext", None)
_DEFAULT_EXTENDED = getattr(distribute_lib, "_DefaultDistributionExtended", None)


def _check_no_per_replica(value):
    """Raises ValueError where `value`, all-reduced outside every strategy's
    scope, holds what strategy.run returned (per-replica values)."""
    flat = value if isinstance(value, list) else nest.flatten(value)
    if any(type(item) is values.PerReplica for item in flat):
        apply_checks.check_no_per_replica_values(
            (nest.flatten(value),), {}, _ALL_REDUCE, apply_checks.OUTSIDE_THEIR_SCOPE)


def _transfers_record_here():
    if spanning_tapes.merging_for_spanned_replicas():
        return True
    return (not spanning_tapes.merging_for_a_run() and
            compat.recording_module.could_possibly_record() and
            not pywrap_tfe.TFE_Py_TapeSetIsStopped())


def _recordable(extended, value, kind=compat.Tensor):
    """Whether `value` is per-replica `kind` values (dense tensors), one per
    replica of the strategy in this process (under a strategy of several
    workers with one replica here, what `strategy.run` returns is that
    replica's value itself). The default strategy (no scope) has none."""
    if type(extended) is _DEFAULT_EXTENDED:
        return False
    if type(value) is values.PerReplica:
        components = value.values
    elif (isinstance(value, kind) and workers.extended_of_several_workers(extended) and
          len(extended.worker_devices) == 1):
        components = (value,)
    else:
        return False
    return (len(components) == len(extended.worker_devices) and
            all(isinstance(c, kind) for c in components))


def _check_within_one_worker(extended, values_, symbol):
    """Raises ValueError if a merge_call function for the replicas of a
    strategy.run that tapes around it record reduces per-replica values
    across workers: its backward pass would need every worker's cotangents."""
    if (spanning_tapes.merging_for_spanned_replicas() and
            workers.extended_of_several_workers(extended) and
            any(_recordable(extended, value) for value in values_)):
        raise _across_workers_refusal(symbol, "a reduction inside the replicas")


def _across_workers_refusal(symbol, what):
    return events.refused(ValueError(errors.message(
        "cannot differentiate a transfer across workers", symbol,
        "strategy.reduce (or batch_reduce_to) of strategy.run's values in "
        "cross-replica context under a strategy of several workers",
        f"{what} across workers (MultiWorkerMirroredStrategy) that a tape "
        "records, whose backward pass would need every worker's cotangents",
        "Open the tape inside the function you pass to strategy.run, or "
        "reduce the replicas' values with strategy.reduce outside them")))


# All-reduce: ReplicaContext.all_reduce, reduce_to, batch_reduce_to ---------


def make_all_reduce(original):
    """Returns a `ReplicaContext.all_reduce` that, in the replicas of a run
    only tapes around it record, reduces through `merge_call` without
    TensorFlow's custom gradient."""

    @functools.wraps(original)
    def all_reduce(self, reduce_op, value, options=None):
        spanning_tapes.check_not_differentiating_replicas(self, _ALL_REDUCE)
        if type(self) is _DEFAULT_REPLICA_CONTEXT:
            # No strategy's scope is open: Keras 3's optimizers all-reduce
            # through the default replica context; strategy.run's values
            # reach it only when applied outside their strategy's scope.
            _check_no_per_replica(value)
            return original(self, reduce_op, value, options)
        apply_checks.check_no_total(self.num_replicas_in_sync, value, _ALL_REDUCE)
        if not _in_its_replica(self, _ALL_REDUCE):
            return value  # The sum, and the mean, of one replica's value.
        with boundary.translated(_ROUTING, _ALL_REDUCE):
            routed = _transfers_in_the_calling_thread(self, value, _ALL_REDUCE)
        if not routed:
            return original(self, reduce_op, value, options)
        options = options or collective_util.Options()

        def batch_all_reduce(strategy, *per_replica):
            return strategy.extended.batch_reduce_to(
                reduce_op, [(v, v) for v in per_replica], options)

        with boundary.translated(_ROUTING, _ALL_REDUCE):
            return _merged(self, batch_all_reduce, value)

    return all_reduce


def make_reduce_to(original):
    """Returns a `StrategyExtended.reduce_to` that records the reduction
    where described above."""

    @functools.wraps(original)
    def reduce_to(self, reduce_op, value, destinations, options=None):
        if events.reductions_heard():
            events.record_reduction(reduce_op, value,
                                    spanning_tapes.spanning_tapes_record_here(),
                                    sys._getframe())
        with boundary.translated(_RECORDING, _SYMBOL):
            _check_within_one_worker(self, [value], _SYMBOL)
            recorded = _recordable(self, value) and (
                spanning_tapes.merging_for_spanned_replicas() or
                (workers.extended_of_several_workers(self) and _transfers_record_here()))
        if not recorded:
            return original(self, reduce_op, value, destinations, options)
        reduced = _unrecorded(lambda: original(self, reduce_op, value, destinations,
                                               options), _SYMBOL)
        with boundary.translated(_RECORDING, _SYMBOL):
            _record_reduction(self, reduce_op, value, reduced)
        return reduced

    return reduce_to


def make_batch_reduce_to(original):
    """Returns a `StrategyExtended.batch_reduce_to` that records each
    reduction where described above."""

    @functools.wraps(original)
    def batch_reduce_to(self, reduce_op, value_destination_pairs, options=None):
        pairs = list(value_destination_pairs)
        with boundary.translated(_RECORDING, _SYMBOL):
            _check_within_one_worker(self, [value for value, _ in pairs], _SYMBOL)
            recorded = _transfers_record_here() and any(
                _recordable(self, value) or
                _recordable(self, value, indexed_slices.IndexedSlices)
                for value, _ in pairs)
        if not recorded:
            return original(self, reduce_op, pairs, options)
        reduced = _unrecorded(lambda: original(self, reduce_op, pairs, options), _SYMBOL)
        with boundary.translated(_RECORDING, _SYMBOL):
            for (value, _), result in zip(pairs, reduced):
                if _recordable(self, value):
                    _record_reduction(self, reduce_op, value, result)
                elif _recordable(self, value, indexed_slices.IndexedSlices):
                    _record_refusal(self, value, result)
        return reduced

    return batch_reduce_to


def _record_refusal(extended, value, reduced):
    """Records the reduction of per-replica `IndexedSlices` with a backward
    function that raises: TensorFlow's reduction of them is not
    differentiable either (the gradient was silently None)."""
    inputs = [c.values for c in extended._local_results(value)]
    outputs = [r.values for r in extended._local_results(reduced)
               if isinstance(r, indexed_slices.IndexedSlices)]

    def refuse(*cotangents):
        raise events.refused(ValueError(errors.message(
            "cannot differentiate an all-reduce of IndexedSlices", _SYMBOL,
            "dense values in an all-reduce a tape around strategy.run "
            "differentiates", "IndexedSlices (sparse rows, such as an "
            "embedding's gradient), whose reduction concatenates rows and has "
            "no gradient in TensorFlow either",
            "Convert them to a dense tensor before the all-reduce "
            "(tf.convert_to_tensor), or keep them out of what the tape "
            "differentiates")))

    compat.recording_module.record_operation(REDUCTION, outputs, inputs, refuse)


def _record_reduction(extended, reduce_op, value, reduced):
    """Records each of `reduced`'s local results as one operation of this
    process's replicas' values; a MEAN divides by every replica of every
    worker."""
    if isinstance(reduce_op, str):
        reduce_op = reduce_util.ReduceOp(reduce_op.upper())
    components = extended._local_results(value)
    divisor = (extended._container_strategy().num_replicas_in_sync
               if reduce_op == reduce_util.ReduceOp.MEAN else None)
    for result in extended._local_results(reduced):
        compat.recording_module.record_operation(
            REDUCTION, [result], list(components), _broadcast(components, divisor))


def _broadcast(components, divisor):
    """The backward function of one reduced result: its cotangent on each
    component's device, divided by `divisor` (None: 1; a division, as the
    gradient of TensorFlow's own mean is)."""

    def backward(cotangent):
        if cotangent is None:
            return [None] * len(components)
        gradients = []
        for component in components:
            with ops.device(component.device):
                gradient = array_ops.identity(cotangent)
                if divisor is not None:
                    gradient = math_ops.truediv(
                        gradient, math_ops.cast(divisor, gradient.dtype))
            gradients.append(gradient)
        return gradients

    return backward


# All-gather: ReplicaContext.all_gather, strategy.gather (_gather_to) -------


def make_all_gather(original):
    """Returns a `ReplicaContext.all_gather` that, in the replicas of a run
    only tapes around it record, gathers through `merge_call` without
    TensorFlow's custom gradient."""

    @functools.wraps(original)
    def all_gather(self, value, axis, options=None):
        spanning_tapes.check_not_differentiating_replicas(self, _ALL_GATHER)
        if not _in_its_replica(self, _ALL_GATHER):
            return value  # The gather of one replica's value.
        with boundary.translated(_ROUTING, _ALL_GATHER):
            routed = _transfers_in_the_calling_thread(self, value, _ALL_GATHER)
        if not routed:
            return original(self, value, axis, options)
        options = options or collective_util.Options()

        def batch_all_gather(strategy, *per_replica):
            return strategy.extended._batch_gather_to(
                [(v, v) for v in per_replica], axis, options)

        with boundary.translated(_ROUTING, _ALL_GATHER):
            return _merged(self, batch_all_gather, value)

    return all_gather


def make_gather_to(original):
    """Returns a `StrategyExtended._gather_to` (what `strategy.gather` and
    `all_gather` call) that records the gather where described above."""

    @functools.wraps(original)
    def _gather_to(self, value, destinations, axis, options=None):
        with boundary.translated(_RECORDING, _GATHER_SYMBOL):
            recorded = _transfers_record_here() and _recordable(self, value)
            if recorded and workers.extended_of_several_workers(self):
                raise _across_workers_refusal(_GATHER_SYMBOL, "a gather")
        if not recorded:
            return original(self, value, destinations, axis, options)
        gathered = _unrecorded(lambda: original(self, value, destinations, axis, options),
                               _GATHER_SYMBOL)
        with boundary.translated(_RECORDING, _GATHER_SYMBOL):
            components = self._local_results(value)
            for result in self._local_results(gathered):
                compat.recording_module.record_operation(
                    GATHER, [result], list(components), _slices(components, axis))
        return gathered

    return _gather_to


def _slices(components, axis):
    """The backward function of one gathered result: each component's slice
    of its cotangent along `axis`, on the component's device."""

    def backward(cotangent):
        if cotangent is None:
            return [None] * len(components)
        with ops.device(backward_placement.device_of(cotangent) or ""):
            sizes = [array_ops.shape(c)[axis] for c in components]
            pieces = array_ops.split(cotangent, sizes, axis=axis)
        gradients = []
        for piece, component in zip(pieces, components):
            with ops.device(component.device):
                gradients.append(array_ops.identity(piece))
        return gradients

    return backward
