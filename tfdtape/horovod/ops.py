"""Horovod's collective operations on TensorFlow's collectives between
processes (`basics.Job`): `allreduce`, `grouped_allreduce`, `allgather`,
`broadcast`, `broadcast_variables`, `broadcast_object`, `allgather_object`.

Eagerly and in `tf.function`. Horovod matches collectives across processes
by name; here every process must issue the same collectives in the same
order (as a Horovod program's graph does), and `name` only names the ops.
Each call is checked first (`negotiation`): where the processes' calls
differ, every process raises instead of pairing them.
A job of one process: every collective is the identity (scaling and
averaging still apply).
"""

import functools
import inspect
import numbers
import pickle

import numpy as np
import tensorflow as tf

from tfdtape import errors
from tfdtape.horovod import basics
from tfdtape.horovod import collectives
from tfdtape.horovod import compression as compression_lib
from tfdtape.horovod import fusion
from tfdtape.horovod import negotiation
from tfdtape.horovod.collectives import Adasum
from tfdtape.horovod.collectives import Average
from tfdtape.horovod.collectives import Sum

_NAMES = collectives.OP_NAMES


def _refuse(failed, symbol, expected, found, remedy, kind=ValueError):
    raise kind(errors.message(failed, symbol, expected, found, remedy))


def resolve_op(op, average, symbol):
    """Horovod's op from `op` and the deprecated `average`."""
    if average is not None:
        if op is not None:
            _refuse("both op and average were given", symbol, "one of them",
                    f"op={op}, average={average}", "pass op only (average is deprecated)")
        return Average if average else Sum
    op = Average if op is None else op
    if op == Adasum:
        from tfdtape.horovod import unsupported
        unsupported.refuse("Adasum")
    if op not in collectives.MERGES:
        _refuse("an unknown reduction op", symbol,
                "hvd.Average, hvd.Sum, hvd.Min, hvd.Max or hvd.Product", repr(op),
                "pass one of them")
    return op


def in_process_set(function):
    """`function` (a collective taking `process_set`) run among its process
    set's processes (`collectives.within`)."""
    signature = inspect.signature(function)
    symbol = "tfdtape.horovod." + function.__name__

    @functools.wraps(function)
    def run(*args, **kwargs):
        process_set = signature.bind(*args, **kwargs).arguments.get("process_set")
        with collectives.within(process_set, symbol):
            return function(*args, **kwargs)
    return run


def check_predivide(op, predivide, symbol):
    """Refuses a gradient predivide factor with an op other than Average."""
    if predivide != 1.0 and op != Average:
        _refuse("gradient_predivide_factor was given with an op other than Average",
                symbol, "op=hvd.Average with a predivide factor", f"op={op}",
                "drop gradient_predivide_factor, or use op=hvd.Average")


def check_predivided_slices(gradients, predivide, symbol):
    """Refuses a gradient predivide factor where a gradient is IndexedSlices:
    its pre- and postscale factors are ones Horovod, which gathers
    IndexedSlices, refuses for them (as `check_slices` does), so Horovod's
    tapes and optimizers raise here too.

    Raises:
        NotImplementedError: so.
    """
    if predivide != 1.0 and any(isinstance(gradient, tf.IndexedSlices)
                                for gradient in gradients):
        _refuse("an IndexedSlices gradient was to be predivided", symbol,
                "gradient_predivide_factor=1 where a gradient is IndexedSlices (an "
                "embedding's, tf.gather's)", f"gradient_predivide_factor={predivide}",
                "pass sparse_as_dense=True, or leave gradient_predivide_factor at 1",
                kind=NotImplementedError)


def predivided(op, predivide, process_set=None):
    """(op, prescale, postscale) of Horovod's gradient predivision: Average
    with a factor f is a Sum scaled by 1/f before and f/size after (the
    size of `process_set`; None: the set in effect)."""
    if op == Average and predivide != 1.0:
        size = collectives.size() if process_set is None else len(process_set.ranks)
        return Sum, 1.0 / predivide, predivide / size
    return op, 1.0, 1.0


def check_averageable(tensors, op, symbol):
    """Refuses an Average of bool tensors (which no division takes).

    Raises:
        ValueError: so.
    """
    if op == Average and any(getattr(tensor, "dtype", None) == tf.bool for tensor in tensors):
        _refuse("a bool tensor was to be averaged", symbol, "a numeric tensor for "
                "op=hvd.Average", "bool", "cast it to a number, or pass op=hvd.Sum "
                "(a logical or), hvd.Min or hvd.Max")


def check_slices(tensors, op, prescale_factor, postscale_factor, symbol):
    """Refuses, as Horovod does, IndexedSlices among `tensors` with an op
    other than Sum and Average, or with a scale factor (they are gathered,
    not reduced).

    Raises:
        NotImplementedError: so.
    """
    if not any(isinstance(tensor, tf.IndexedSlices) for tensor in tensors):
        return
    if op not in (Sum, Average):
        _refuse("IndexedSlices were to be reduced by " + _NAMES[op], symbol,
                "op=hvd.Sum or hvd.Average for IndexedSlices", _NAMES[op],
                "densify them (tf.convert_to_tensor) or use sparse_as_dense=True",
                kind=NotImplementedError)
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        _refuse("IndexedSlices were to be scaled", symbol,
                "prescale_factor and postscale_factor of 1 for IndexedSlices",
                f"prescale_factor={prescale_factor}, postscale_factor={postscale_factor}",
                "scale the values yourself, or densify them (sparse_as_dense=True)",
                kind=NotImplementedError)


def _scaled(value, factor):
    """`value` times `factor`; an integer tensor is scaled as float64 and
    truncated back to its dtype (a factor of 0.5 halves it, not zeroes it),
    a 16-bit float as float32 and rounded back, as Horovod scales them. The
    factor keeps its Python float's 53 bits; Horovod's travels as a float32
    attribute (2/3 is 0.6666666865 there: in float64 results, and 10 x 0.7
    truncates to 6 in integers where this gives 7), docs/horovod.md."""
    if factor == 1.0:
        return value
    if value.dtype.is_integer:
        return tf.cast(tf.cast(value, tf.float64) * factor, value.dtype)
    if value.dtype in (tf.float16, tf.bfloat16):
        return tf.cast(tf.cast(value, tf.float32) * factor, value.dtype)
    return value * factor_in(factor, value.dtype)


def factor_in(factor, dtype):
    """A scale factor as a tensor of `dtype`: a Python number converted at
    that precision (a float64 factor of 2/3 keeps its 53 bits; `tf.cast`
    of a Python number passes it through float32 first)."""
    return tf.cast(factor, dtype) if tf.is_tensor(factor) else tf.constant(factor, dtype)


def reduce_dense(tensor, op, prescale_factor, postscale_factor, compression, symbol):
    """The all-reduce of one dense tensor the processes agreed on,
    differentiable for Sum and Average as Horovod's: the gradient is the
    same all-reduce (checked) of the upstream gradient. Min, Max and
    Product have no gradient."""

    process_set_id = collectives.current_set()

    def gradient(upstream):
        if op not in (Sum, Average):
            _refuse("a gradient through an all-reduce with no derivative", symbol,
                    "op=hvd.Sum or hvd.Average", _NAMES[op],
                    "differentiate around the all-reduce", kind=LookupError)
        with collectives.resumed(process_set_id):  # its check rides in it where it can
            return reduce_group([upstream], op, prescale_factor, postscale_factor,
                                compression)[0]

    @tf.custom_gradient
    def reduce_one(value):
        value = _scaled(value, prescale_factor)
        compressed, context = compression.compress(value)
        sendable, restore = collectives.sendable(compressed, symbol, reduced=True)
        result = compression.decompress(
            restore(collectives.all_reduce(sendable, op)), context)
        if op == Average and result.dtype.is_integer:
            # Horovod's integer average: the sum scaled by postscale / size
            # in float64, truncated toward zero.
            return _scaled(result, postscale_factor / collectives.size()), gradient
        if op == Average:
            result = result / tf.cast(collectives.size(), result.dtype)
        return _scaled(result, postscale_factor), gradient

    return reduce_one(tensor)


def _reduced_slices(slices, op):
    """IndexedSlices reduced as Horovod does (`check_slices` passed): every
    process's values and indices gathered (values divided by the size for
    Average)."""
    symbol = "tfdtape.horovod.allreduce"
    values, counts = _gathered(slices.values, symbol)
    indices = _gather_rows(slices.indices, counts, symbol)
    if op == Average:
        values = values / tf.cast(collectives.size(), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


def negotiated(kind, tensors, symbol, refusal=(0, None), **described):
    """Checks that every process issues this collective (`negotiation`);
    the processes' descriptions, or None in a job of one. `refusal`: (the
    code in negotiation.REFUSALS of what this process refuses, an int or
    an int32 scalar tensor; the exception it raises): every process decides
    alike, eagerly here, in a graph by an assertion every process's
    collective waits for (the caller builds the collective on stand-in
    tensors, which never run).

    Raises:
        the refusal's exception, or tf.errors.FailedPreconditionError (see
        `negotiation.agreed`).
    """
    code, exception = refusal
    if collectives.size() == 1:
        if (isinstance(code, int) and code) or (tf.executing_eagerly() and int(code)):
            raise exception
        return None
    return negotiation.agreed(negotiation.describe(kind, tensors, refusal=code, **described),
                              symbol, exception)


def stand_in(tensor):
    """`tensor`, a refused scalar as a vector: in a graph, what the
    collective is built on where the check's assertion refuses it when run."""
    return tf.reshape(tensor, [1]) if tensor.shape.rank == 0 else tensor


def after(everyone, tensor):
    """`tensor`, computed after the negotiation that gave `everyone`."""
    if everyone is None or tf.executing_eagerly():
        return tensor
    with tf.control_dependencies([everyone]):
        return tf.identity(tensor)


@in_process_set
def allreduce(tensor, average=None, device_dense="", device_sparse="",
              compression=compression_lib.Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, name=None,
              process_set=None, ignore_name_scope=False):
    """Horovod's allreduce: the reduction over every process of `tensor` (a
    tensor, variable or IndexedSlices; the same dtype and shape on every
    process, else tf.errors.FailedPreconditionError on every process).

    IndexedSlices are gathered, not reduced, as Horovod does: the values and
    indices of every process concatenated (values divided by the size for
    Average); only Sum and Average.
    """
    symbol = "tfdtape.horovod.allreduce"
    op = resolve_op(op, average, symbol)
    check_slices([tensor], op, prescale_factor, postscale_factor, symbol)
    with tf.name_scope(name or "HorovodAllreduce"):
        if isinstance(tensor, tf.IndexedSlices):
            return _reduced_slices(tensor, op)
        tensor = tf.convert_to_tensor(tensor)
        check_averageable([tensor], op, symbol)
        everyone = negotiated("allreduce", [tensor], symbol, op=op, name=name)
        return reduce_dense(after(everyone, tensor), op, prescale_factor, postscale_factor,
                        compression, symbol)


def reduce_group(tensors, op, prescale_factor=1.0, postscale_factor=1.0,
                 compression=compression_lib.Compression.none,
                 kind="grouped_allreduce", symbol="tfdtape.horovod.grouped_allreduce",
                 absent=()):
    """`allreduce` of each of `tensors` (`op` resolved), checked once for
    all of them (with `absent`, which of a tape's sources had no gradient);
    dense ones fused into as few collectives as `fusion` packs them.

    A Sum or Average with a float32 or float64 tensor, on up to
    RIDER_MOST_PROCESSES processes, carries its check inside its first pack
    (`negotiation.rider`): no collective of its own. Where the packs' sizes
    differ, TensorFlow's collective reports the mismatch first.
    """
    check_slices(tensors, op, prescale_factor, postscale_factor, symbol)
    tensors = [tensor if isinstance(tensor, tf.IndexedSlices) else tf.convert_to_tensor(tensor)
               for tensor in tensors]
    check_averageable(tensors, op, symbol)
    dense = [index for index, tensor in enumerate(tensors)
             if not isinstance(tensor, tf.IndexedSlices)]
    carrier = _rider_dtype([tensors[index] for index in dense], op, compression)
    everyone = None
    riders = []
    if carrier is not None:
        riders = [negotiation.rider(kind, tensors, carrier, op, absent)]
    else:  # with no tensors too: every process issues the check
        everyone = negotiated(kind, tensors, symbol, op=op, absent=absent)
    reduced = fusion.fused(
        riders + [after(everyone, tensors[index]) for index in dense],
        lambda pack: reduce_dense(pack, op, prescale_factor, postscale_factor, compression,
                              symbol),
        wire_dtype=compression.wire_dtype)
    dense_results = reduced[len(riders):]
    if riders:
        scale = prescale_factor * postscale_factor / (collectives.size() if op == Average else 1)
        dense_results = negotiation.checked(
            negotiation.rider_differs(reduced[0], scale), dense_results, symbol,
            lambda: negotiation.describe(kind, tensors, op=op, absent=absent))
    results = [None] * len(tensors)
    for index, value in zip(dense, dense_results):
        results[index] = value
    # IndexedSlices are gathered once the check passed: processes that
    # disagree on them (one has a gradient, another None) must not meet in
    # different gathers first.
    checked = [everyone] if everyone is not None else list(dense_results)
    for index, tensor in enumerate(tensors):
        if index not in dense:
            results[index] = _reduced_slices(_slices_after(checked, tensor), op)
    return results


def _slices_after(checked, slices):
    """`slices`, computed after the tensors `checked` (in a graph)."""
    if not checked or tf.executing_eagerly():
        return slices
    with tf.control_dependencies(checked):
        return tf.IndexedSlices(tf.identity(slices.values), tf.identity(slices.indices),
                                slices.dense_shape)


def _rider_dtype(dense, op, compression):
    """The dtype the check rides in (that of the first dense tensor sent as
    float32 or float64), or None where it must travel on its own."""
    if collectives.size() == 1 or collectives.size() > negotiation.RIDER_MOST_PROCESSES or \
            op not in (Sum, Average):
        return None
    for tensor in dense:
        if compression.wire_dtype(tensor.dtype) in negotiation.RIDER_DTYPES:
            return tensor.dtype
    return None


@in_process_set
def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="",
                      compression=compression_lib.Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """`allreduce` of each of `tensors`, checked once for all of them, dense
    ones fused into as few collectives as `fusion` packs them (one per dtype
    up to HOROVOD_FUSION_THRESHOLD bytes)."""
    op = resolve_op(op, average, "tfdtape.horovod.grouped_allreduce")
    return reduce_group(tensors, op, prescale_factor, postscale_factor, compression)


@in_process_set
def allgather(tensor, name=None, ignore_name_scope=False, process_set=None):
    """Horovod's allgather: every process's `tensor` concatenated along the
    first dimension, in rank order; first dimensions may differ between
    processes, the dtype and the other dimensions may not (else
    tf.errors.FailedPreconditionError on every process). Its gradient is
    Horovod's: the average over the processes of the gathered tensor's
    gradient, this process's rows of it."""
    symbol = "tfdtape.horovod.allgather"
    tensor = tf.convert_to_tensor(tensor)
    with tf.name_scope(name or "HorovodAllgather"):
        @tf.custom_gradient
        def gathered(value):
            result, counts = _gathered(value, symbol, name, refusal=scalar_refusal(
                [value], "a scalar to gather", "a scalar was to be gathered", symbol,
                "a tensor of rank 1 or more (gathered along its first dimension)",
                "gather tf.reshape(x, [1])"))

            process_set_id = collectives.current_set()

            def gradient(upstream):
                with collectives.resumed(process_set_id):
                    total = allreduce(upstream, op=Average)
                    return tf.split(total, counts, axis=0)[collectives.rank()] \
                        if collectives.size() > 1 else total
            return result, gradient

        return gathered(tensor)


def scalar_refusal(tensors, reason, failed, symbol, expected, remedy):
    """The refusal (`negotiated`'s) where one of `tensors` is a scalar:
    the code of `reason` in negotiation.REFUSALS and a ValueError; else
    none."""
    if all(tensor.shape.rank != 0 for tensor in tensors):
        return 0, None
    return negotiation.REFUSALS.index(reason), ValueError(
        errors.message(failed, symbol, expected, "a scalar", remedy))


def _gathered(tensor, symbol, name=None, refusal=(0, None)):
    """(every process's `tensor` concatenated in rank order, each one's
    first dimension), negotiated: the row counts travel in the check."""
    everyone = negotiated("allgather", [tensor], symbol, name=name, refusal=refusal,
                           rows=tf.shape(tf.reshape(tensor, [-1]) if tensor.shape.rank == 0
                                         else tensor, out_type=tf.int32)[0])
    if everyone is None:
        return tf.identity(tensor), tf.shape(tensor, out_type=tf.int32)[:1]
    counts = negotiation.rows(everyone)
    tensor = stand_in(tensor)
    return _gather_rows(tensor, counts, symbol), counts


def _gather_rows(tensor, counts, symbol):
    """Gathers `tensor` whose first dimension on each process is `counts`
    (known to agree in all else)."""
    if collectives.size() == 1:
        return tf.identity(tensor)
    sendable, restore = collectives.sendable(tensor, symbol)
    longest = tf.reduce_max(counts)
    padding = tf.concat([[[0, longest - tf.shape(sendable)[0]]],
                         tf.zeros([tf.rank(sendable) - 1, 2], tf.int32)], 0)  # any rank
    everything = collectives.all_gather(tf.pad(sendable, padding))
    keep = tf.reshape(tf.sequence_mask(counts, longest), [-1])
    return restore(tf.boolean_mask(everything, keep))


def _check_root(root_rank, symbol):
    """Refuses a root that is no process of the set in effect (its global
    rank, as Horovod's)."""
    ranks = collectives.group().ranks
    if not isinstance(root_rank, numbers.Integral) or root_rank not in ranks:
        if collectives.current_set() == 0:
            _refuse("a broadcast from a rank the job does not have", symbol,
                    f"a root_rank from 0 to {len(ranks) - 1}", repr(root_rank),
                    "pass the rank of a process of the job")
        _refuse("a broadcast from a rank outside its process set", symbol,
                f"a root_rank of the set, one of {list(ranks)} (global ranks)",
                repr(root_rank), "pass the global rank of a process of the set")


@in_process_set
def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=None):
    """Horovod's broadcast: `root_rank`'s `tensor` on every process (the
    same dtype and shape, and the same root, on each, else
    tf.errors.FailedPreconditionError on every process). Its gradient is
    Horovod's: the average over the processes of the upstream gradient on
    the root, zeros elsewhere."""
    symbol = "tfdtape.horovod.broadcast"
    _check_root(root_rank, symbol)
    tensor = tf.convert_to_tensor(tensor)
    with tf.name_scope(name or "HorovodBroadcast"):
        @tf.custom_gradient
        def broadcasted(value):
            everyone = negotiated("broadcast", [value], symbol, root_rank=root_rank,
                                   name=name)
            result = _sent(after(everyone, value), root_rank, symbol)

            process_set_id = collectives.current_set()

            def gradient(upstream):
                with collectives.resumed(process_set_id):
                    total = allreduce(upstream, op=Average)
                return total if basics.rank() == root_rank else tf.zeros_like(total)
            return result, gradient

        return broadcasted(tensor)


def _sent(tensor, root_rank, symbol):
    sendable, restore = collectives.sendable(tensor, symbol)
    return restore(collectives.broadcast(sendable, root_rank))


@in_process_set
def broadcast_variables(variables, root_rank, process_set=None, inplace=False):
    """Assigns `root_rank`'s value of each of `variables` on every process
    (checked once for all of them, fused as `fusion` packs them); in a
    graph, returns the group of the assignments."""
    symbol = "tfdtape.horovod.broadcast_variables"
    _check_root(root_rank, symbol)
    variables = list(variables)
    values = [tf.convert_to_tensor(variable) for variable in variables]
    everyone = negotiated("broadcast_variables", values, symbol, root_rank=root_rank) \
        if values else None
    sent = fusion.fused([after(everyone, value) for value in values],
                        lambda pack: _sent(pack, root_rank, symbol))
    assignments = [variable.assign(value) for variable, value in zip(variables, sent)]
    if tf.executing_eagerly():
        return None
    return tf.group(*assignments)


@in_process_set
def broadcast_(variables, root_rank, name=None, process_set=None):
    """Horovod's in-place broadcast: `broadcast_variables` of `variables` (a
    list of variables, or one), returning them (holding `root_rank`'s
    values)."""
    if isinstance(variables, tf.Variable) or hasattr(variables, "assign"):
        broadcast_variables([variables], root_rank, process_set=process_set)
        return variables
    variables = list(variables)
    broadcast_variables(variables, root_rank, process_set=process_set)
    return variables


def broadcast_global_variables(root_rank):
    """TensorFlow 1's global variables broadcast from `root_rank`. Refused:
    eagerly as Horovod refuses it (there are no global variables), and in a
    TensorFlow 1 graph, whose session cannot reach the job's processes.

    Raises:
        RuntimeError: called eagerly.
        NotImplementedError: called in a graph.
    """
    if tf.executing_eagerly():
        _refuse("broadcast_global_variables was called eagerly",
                "tfdtape.horovod.broadcast_global_variables",
                "a TensorFlow 1 graph (tf.compat.v1), which has global variables",
                "eager execution",
                "call hvd.broadcast_variables(model.variables + optimizer.variables, "
                "root_rank) instead", kind=RuntimeError)
    _refuse("broadcast_global_variables was called in a graph",
            "tfdtape.horovod.broadcast_global_variables",
            "an eager call or a tf.function (TensorFlow 2)",
            "a TensorFlow 1 graph, whose session runs on this process alone",
            "call hvd.broadcast_variables(variables, root_rank) eagerly once the "
            "variables exist", kind=NotImplementedError)


@in_process_set
def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=None):
    """`allgather` of each of `tensors`, in order (of none, the check alone:
    a process with none pairs with no other's gather)."""
    tensors = list(tensors)
    if not tensors:
        negotiated("allgather", [], "tfdtape.horovod.grouped_allgather")
    return [allgather(tensor, process_set=process_set) for tensor in tensors]


@in_process_set
def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=None):
    """`root_rank`'s `obj` (anything `pickle` takes) on every process;
    eagerly."""
    symbol = "tfdtape.horovod.broadcast_object"
    _eagerly(symbol)
    rank = basics.rank()
    payload = _pickled(obj) if rank == root_rank else np.zeros(0, np.int32)
    length = broadcast(tf.constant([payload.size], tf.int32), root_rank)
    if rank != root_rank:
        payload = np.zeros(int(length[0]), np.int32)
    received = _sent(tf.constant(payload, tf.int32), root_rank, symbol)
    return obj if rank == root_rank else _unpickled(received.numpy())


@in_process_set
def allgather_object(obj, session=None, name=None, process_set=None):
    """Every process's `obj` (anything `pickle` takes), a list in rank
    order; eagerly."""
    symbol = "tfdtape.horovod.allgather_object"
    _eagerly(symbol)
    gathered, counts = _gathered(tf.constant(_pickled(obj), tf.int32), symbol)
    bounds = np.cumsum([0, *counts.numpy()])
    gathered = gathered.numpy()
    return [_unpickled(gathered[start:end]) for start, end in zip(bounds, bounds[1:])]


def _eagerly(symbol):
    if not tf.executing_eagerly():
        in_function = getattr(tf.compat.v1.get_default_graph(), "building_function", False)
        _refuse("an object collective was called in a graph", symbol,
                "an eager call (objects are pickled in Python)",
                "a tf.function" if in_function else "a TensorFlow 1 graph",
                "call it outside tf.function" if in_function
                else "call it eagerly, outside the graph")


def _pickled(obj):
    return np.frombuffer(pickle.dumps(obj), np.uint8).astype(np.int32)


def _unpickled(values):
    return pickle.loads(np.asarray(values, np.uint8).tobytes())
