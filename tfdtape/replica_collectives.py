"""All-reduces and all-gathers inside the replicas of a `strategy.run` that
a tape around it records: differentiated over every replica at once.

`ReplicaContext.all_reduce` (what synchronized BatchNormalization and
losses over every replica's values call) and `ReplicaContext.all_gather`
wrap their cross-device transfer in a `tf.custom_gradient` whose backward
pass is another collective, issued by every replica: right for a tape
inside the replica function, but a tape around the run computes every
replica's backward pass in one thread, outside replica context, where no
replica can issue it (and eagerly the transfer itself, recorded in the
calling thread, has no gradient: `LookupError`).

While only tapes around the run record in its replicas, tfdtape's versions
make the transfer through `merge_call`, as TensorFlow does, without the
custom gradient: the merge_call function runs in the calling thread, where
`tfdtape.recorded_transfers` records it with its transpose. Everywhere else
(a tape opened inside the replica function, `IndexedSlices`, strategies
that transfer without `merge_call`, the replicas of other workers)
TensorFlow's function runs unchanged. In the backward pass of a tape that
recorded the replicas (`tf.recompute_grad` recomputing, a custom gradient),
which runs outside them, either raises: there it would reduce nothing.
A `tf.autodiff.ForwardAccumulator` inside the replica counts as a tape
opened there (forward-mode derivatives need TensorFlow's path).

On N devices the backward pass of an all-reduce copies each result's
cotangent from each replica's device to every other: N(N-1) transfers of
the reduced value's size, against 2(N-1) shares of it for a ring
all-reduce in the tutorial step; that of an all-gather moves each replica's
slice of each result's cotangent to its device, N(N-1) slices of the
input's size. What synchronized BatchNormalization reduces (a sum, a sum of
squares and a count per channel) is small.
"""

from tensorflow.python.distribute import collective_util
from tensorflow.python.framework import indexed_slices
from tensorflow.python.framework import ops
from tensorflow.python.util import nest

from tfdtape import compat
from tfdtape import component_totals
from tfdtape import cross_replica_reads
from tfdtape import errors
from tfdtape import events
from tfdtape import spanning_tapes

_ALL_REDUCE = "tf.distribute.ReplicaContext.all_reduce"
_ALL_GATHER = "tf.distribute.ReplicaContext.all_gather"


def make_all_reduce(original):
    """Returns a `ReplicaContext.all_reduce` that, in the replicas of a run
    only tapes around it record, reduces through `merge_call` without
    TensorFlow's custom gradient."""

    def all_reduce(self, reduce_op, value, options=None):
        spanning_tapes.check_not_differentiating_replicas(self, _ALL_REDUCE)
        check_no_total(self.num_replicas_in_sync, value, _ALL_REDUCE)
        if not _in_its_replica(self, _ALL_REDUCE):
            return value  # The sum, and the mean, of one replica's value.
        if not _transfers_in_the_calling_thread(self, value, _ALL_REDUCE):
            return original(self, reduce_op, value, options)
        options = options or collective_util.Options()

        def batch_all_reduce(strategy, *per_replica):
            return strategy.extended.batch_reduce_to(
                reduce_op, [(v, v) for v in per_replica], options)

        return _merged(self, batch_all_reduce, value)

    all_reduce.__doc__ = original.__doc__
    return all_reduce


def check_no_total(replicas, value, symbol):
    """Raises ValueError where `value`, all-reduced inside the replicas of
    a strategy of several (`replicas` in sync), holds a total over the
    replicas (the gradient of a tape around strategy.run:
    `component_totals.made_of_total`), as an optimizer applying it inside
    strategy.run does: TensorFlow would add up every replica's (and every
    worker's) copy of it."""
    if replicas > 1 and component_totals.made_of_total(value):
        raise events.refused(ValueError(errors.message(
            "cannot all-reduce a total over the replicas again", symbol,
            "values computed inside the replicas",
            "the gradient of a tape around strategy.run (already the sum "
            "over every replica and worker), or what was computed from it, "
            "all-reduced inside strategy.run, as an optimizer applying it "
            "there does; every replica's copy would be added up",
            "Apply that gradient in cross-replica context: call "
            "optimizer.apply_gradients outside strategy.run")))


def make_all_gather(original):
    """Returns a `ReplicaContext.all_gather` that, in the replicas of a run
    only tapes around it record, gathers through `merge_call` without
    TensorFlow's custom gradient."""

    def all_gather(self, value, axis, options=None):
        spanning_tapes.check_not_differentiating_replicas(self, _ALL_GATHER)
        if not _in_its_replica(self, _ALL_GATHER):
            return value  # The gather of one replica's value.
        if not _transfers_in_the_calling_thread(self, value, _ALL_GATHER):
            return original(self, value, axis, options)
        options = options or collective_util.Options()

        def batch_all_gather(strategy, *per_replica):
            return strategy.extended._batch_gather_to(
                [(v, v) for v in per_replica], axis, options)

        return _merged(self, batch_all_gather, value)

    all_gather.__doc__ = original.__doc__
    return all_gather


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
            cross_replica_reads.in_multi_worker_mode(strategy)):
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
