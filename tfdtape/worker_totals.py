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
replicas) is all-reduced first, one small collective, so that every worker
reduces the same sources the same way: a source that took part on some
workers only gets zeros from the others, one that took part nowhere is None
on every worker (zeros with `unconnected_gradients=ZERO`), and a term
outside the replicas that only some workers have is refused on every
worker. In a `tf.function` that is the trace's, the same on every worker.
`IndexedSlices` that every replica contributed (and no term outside them)
are gathered, rows concatenated; anything else is reduced dense.

Refused with `ValueError`, raised by every worker alike (the conditions
are the program's, the same on every worker): another tape recording (its
gradient would go through the all-reduce: second order), the gradient
taken inside a control-flow body or what `jacobian` vectorizes, and a
source also read by a route that cannot be told apart from its replicas'
reads (`cross_replica_reads.direct_read`).
"""

import numpy as np
from tensorflow.python.distribute import reduce_util
from tensorflow.python.distribute import values as values_lib
from tensorflow.python.eager import context
from tensorflow.python.framework import constant_op
from tensorflow.python.framework import indexed_slices
from tensorflow.python.framework import ops
from tensorflow.python.ops import array_ops

from tfdtape import compat
from tfdtape import component_totals
from tfdtape import cross_replica_reads
from tfdtape import errors
from tfdtape import replica_recording
from tfdtape import tracing
from tfdtape import worker_agreement

_SYMBOL = "tf.GradientTape.gradient"
_PFOR_BODY_SCOPE = "loop_body"


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
    others = [other for other, _ in replica_recording.tapes_pushed_here()
              if other is not tape and other._tape is not None]
    if others:
        raise _refusal(
            "cannot take a gradient across workers while another tape records",
            "another tape recording, which would differentiate the all-reduce "
            "across workers (a second-order gradient)",
            "Take second-order gradients inside the function you pass to "
            "strategy.run, or with a strategy of one worker")
    graph = ops.get_default_graph()
    if not context.executing_eagerly() and (
            replica_recording.in_control_flow_body(graph) or
            _PFOR_BODY_SCOPE in ops.get_name_scope().split("/")):
        raise _refusal(
            "cannot take a gradient across workers inside control flow",
            "tape.gradient inside a tf.cond branch, a loop body or what "
            "jacobian and tf.vectorized_map vectorize, where the all-reduce "
            "across workers could run other than once on every worker",
            "Take the gradient outside control flow (for a Jacobian, inside "
            "the function you pass to strategy.run)")


def _refusal(what, found, remedy):
    return tracing.refused(ValueError(errors.message(
        f"{what} (MultiWorkerMirroredStrategy)", _SYMBOL,
        "a gradient whose share on each worker can be all-reduced once, exactly",
        found, remedy)))


def reduce(strategy, items):
    """The totals of `items` across the workers of `strategy`; None for a
    source that took part on no worker.

    Args:
        strategy: a strategy of several workers.
        items: (variable, its local components' gradients, what the reads
            outside the replicas contributed or None) for each source, in
            the order given.
    """
    with strategy.scope():  # Also where the gradient is taken with no scope.
        return _reduce(strategy, items)


def _reduce(strategy, items):
    workers = strategy.extended._num_workers
    plans = _plans(strategy, items)
    items = _outside_terms_checked(strategy, items, plans)
    shares = []
    for (variable, parts, outside), plan in zip(items, plans):
        if plan is None:
            shares.append(None)
            continue
        parts = list(parts)
        if plan == "dense":
            parts = [_dense(part, variable, component) for part, component in
                     zip(parts, strategy.experimental_local_results(variable))]
        if outside is not None:
            parts[0] = parts[0] + ops.convert_to_tensor(outside) / workers
        shares.append(values_lib.PerReplica(tuple(parts)))
    reducing = [(share, variable) for share, (variable, _, _) in zip(shares, items)
                if share is not None]
    totals = [None] * len(items)
    if reducing:
        with compat.stop_recording():
            reduced = strategy.extended.batch_reduce_to(
                reduce_util.ReduceOp.SUM, reducing)
        reduced = iter(reduced)
        for index, share in enumerate(shares):
            if share is not None:
                totals[index] = component_totals.here(next(reduced))
    return totals


def _dense(part, variable, component):
    """A component's gradient as a dense tensor on its device (zeros where
    it took no part)."""
    if part is None:
        with ops.device(component.device):
            return array_ops.zeros(variable.shape, variable.dtype)
    return ops.convert_to_tensor(part)


def _plans(strategy, items):
    """How each source is reduced: "sparse" (IndexedSlices from every
    replica of every worker, and no term outside the replicas), "dense", or
    None (no replica of any worker took part, and no term). Eagerly from an
    all-reduce of what took part on each worker; in a graph from this
    worker's, which is every worker's (the same trace).

    Raises:
        ValueError: eagerly, some workers have a term outside the replicas
            for a source and others not (`_differs`).
    """
    local = np.array([[sum(g is not None and not _is_sparse(g) for g in parts),
                       sum(_is_sparse(g) for g in parts), outside is not None]
                      for _, parts, outside in items], np.float32).reshape(-1, 3)
    if context.executing_eagerly() and items:
        counts = _all_reduced(strategy, local)
        replicas, workers = strategy.num_replicas_in_sync, strategy.extended._num_workers
    else:
        counts = local
        replicas, workers = len(strategy.extended.worker_devices), 1
    plans = []
    for (variable, _, _), (dense, sparse, outside) in zip(items, counts):
        if 0 < outside < workers:
            raise _differs(variable)
        if dense + sparse + outside == 0:
            plans.append(None)
        elif sparse == replicas and not outside:
            plans.append("sparse")
        else:
            plans.append("dense")
    return plans


def _is_sparse(gradient):
    return isinstance(gradient, indexed_slices.IndexedSlices)


def _all_reduced(strategy, local):
    """`local` (this worker's counts) summed over every worker (eagerly)."""
    copies = []
    for index, device in enumerate(strategy.extended.worker_devices):
        with ops.device(device):
            copies.append(constant_op.constant(local if index == 0 else 0.0 * local))
    value = values_lib.PerReplica(tuple(copies))
    with compat.stop_recording():
        reduced, = strategy.extended.batch_reduce_to(
            reduce_util.ReduceOp.SUM, [(value, value)])
    return strategy.experimental_local_results(reduced)[0].numpy()


def _outside_terms_checked(strategy, items, plans):
    """`items` with what the reads outside the replicas contributed checked
    to be the same on every worker (`worker_agreement.checked`: eagerly
    ValueError where not, in a graph an assertion the all-reduce waits
    for)."""
    outside = [index for index, (_, _, term) in enumerate(items)
               if term is not None and plans[index] is not None]
    if not outside:
        return items
    terms = worker_agreement.checked(
        strategy, [items[index][2] for index in outside],
        lambda position: _differs(items[outside[position]][0]))
    items = list(items)
    for index, term in zip(outside, terms):
        variable, parts, _ = items[index]
        items[index] = (variable, parts, term)
    return items


def _differs(variable):
    return _refusal(
        f"cannot count a term outside the replicas once for {variable.name!r}",
        f"a term read from {variable.name!r} outside strategy.run whose gradient "
        "differs between workers (it depends on what one worker computed alone, "
        "such as its local results), so no one count of it is the job's",
        "Compute the term inside the function you pass to strategy.run "
        "(tf.nn.scale_regularization_loss), or reduce what it depends on with "
        "strategy.reduce first")
