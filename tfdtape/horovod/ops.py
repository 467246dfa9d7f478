"""Horovod's collective operations on TensorFlow's collectives between
processes (`basics.Job`): `allreduce`, `grouped_allreduce`, `allgather`,
`broadcast`, `broadcast_variables`, `broadcast_object`, `allgather_object`.

Eagerly and in `tf.function`. Horovod matches collectives across processes
by name; here every process must issue the same collectives in the same
order (as a Horovod program's graph does), and `name` only names the ops.
A job of one process: every collective is the identity (scaling and
averaging still apply).
"""

import numbers
import pickle

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import collective_ops

from tfdtape import errors
from tfdtape.horovod import basics
from tfdtape.horovod import compression as compression_lib
from tfdtape.horovod import fusion

Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
"""Horovod's reduction ops, with its values."""

_MERGE = {Average: "Add", Sum: "Add", Min: "Min", Max: "Max", Product: "Mul"}
_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max",
          Product: "Product"}
_WIDENED = (tf.bool, tf.int8, tf.uint8, tf.int16, tf.uint16)
"""Dtypes TensorFlow's collectives do not carry: sent as int32."""


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
    if op not in _MERGE:
        _refuse("an unknown reduction op", symbol,
                "hvd.Average, hvd.Sum, hvd.Min, hvd.Max or hvd.Product", repr(op),
                "pass one of them")
    return op


def check_process_set(process_set):
    """Refuses any process set but the one of every process."""
    if process_set is not None and process_set is not global_process_set:
        from tfdtape.horovod import unsupported
        unsupported.refuse("process_sets")


def check_predivide(op, predivide, symbol):
    """Refuses a gradient predivide factor with an op other than Average."""
    if predivide != 1.0 and op != Average:
        _refuse("gradient_predivide_factor was given with an op other than Average",
                symbol, "op=hvd.Average with a predivide factor", f"op={op}",
                "drop gradient_predivide_factor, or use op=hvd.Average")


def predivided(op, predivide):
    """(op, prescale, postscale) of Horovod's gradient predivision: Average
    with a factor f is a Sum scaled by 1/f before and f/size after."""
    if op == Average and predivide != 1.0:
        return Sum, 1.0 / predivide, predivide / basics.size()
    return op, 1.0, 1.0


class ProcessSet:
    """The one process set tfdtape.horovod has: every process."""

    def __repr__(self):
        return "ProcessSet(all processes)"


global_process_set = ProcessSet()


def _sendable(tensor, symbol):
    """`tensor` as a dtype the collectives carry, and how to get it back."""
    dtype = tensor.dtype
    if dtype == tf.string or dtype == tf.resource or dtype == tf.variant:
        _refuse("a tensor of a dtype no collective carries", symbol,
                "a numeric or bool tensor", dtype.name, "send it as numbers")
    if dtype in _WIDENED:
        return tf.cast(tensor, tf.int32), lambda t: tf.cast(t, dtype)
    return tensor, lambda t: t


def _launched(collective, tensor, **options):
    """`collective` (TensorFlow's all_reduce_v2 or all_gather_v2) of
    `tensor` over the job, on this process's device with the strategy's
    keys; the identity in a job of one."""
    job = basics.job()
    if job.size == 1:
        return tf.identity(tensor)
    launcher = job.launcher
    with tf.device(job.device):
        return collective(tensor, job.size, launcher._group_key,
                          launcher._next_instance_key(),
                          ordering_token=launcher._get_ordering_token(), **options)


def _all_reduce_raw(tensor, merge_op):
    return _launched(collective_ops.all_reduce_v2, tensor, merge_op=merge_op,
                     final_op="Id")


def _all_gather_raw(tensor):
    return _launched(collective_ops.all_gather_v2, tensor)


def reduce_dense(tensor, op, prescale_factor=1.0, postscale_factor=1.0,
                 compression=compression_lib.Compression.none):
    """The all-reduce of one dense tensor, differentiable for Sum and
    Average as Horovod's (the gradient is the same all-reduce of the
    upstream gradient); Min, Max and Product have no gradient."""
    symbol = "tfdtape.horovod.allreduce"
    tensor = tf.convert_to_tensor(tensor)
    if op == Average and not (tensor.dtype.is_floating or tensor.dtype.is_complex):
        _refuse("an integer tensor was to be averaged", symbol,
                "a floating-point tensor for op=Average", tensor.dtype.name,
                "pass op=hvd.Sum and divide as you need")

    @tf.custom_gradient
    def reduced(value):
        result = _scaled_reduce(value, op, prescale_factor, postscale_factor,
                                compression, symbol)

        def gradient(upstream):
            if op not in (Sum, Average):
                _refuse("a gradient through an all-reduce with no derivative", symbol,
                        "op=hvd.Sum or hvd.Average", _NAMES[op],
                        "differentiate around the all-reduce", kind=LookupError)
            return reduce_dense(upstream, op, prescale_factor, postscale_factor,
                                compression)
        return result, gradient

    return reduced(tensor)


def _scaled_reduce(tensor, op, prescale_factor, postscale_factor, compression, symbol):
    if prescale_factor != 1.0:
        tensor = tensor * tf.cast(prescale_factor, tensor.dtype)
    compressed, context = compression.compress(tensor)
    sendable, restore = _sendable(compressed, symbol)
    result = compression.decompress(restore(_all_reduce_raw(sendable, _MERGE[op])),
                                    context)
    if op == Average:
        result = result / tf.cast(basics.size(), result.dtype)
    if postscale_factor != 1.0:
        result = result * tf.cast(postscale_factor, result.dtype)
    return result


def allreduce(tensor, average=None, device_dense="", device_sparse="",
              compression=compression_lib.Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, name=None,
              process_set=None, ignore_name_scope=False):
    """Horovod's allreduce: the reduction over every process of `tensor` (a
    tensor, variable or IndexedSlices; the same shape on every process).

    IndexedSlices are gathered, not reduced, as Horovod does: the values and
    indices of every process concatenated (values divided by the size for
    Average); only Sum and Average.
    """
    symbol = "tfdtape.horovod.allreduce"
    op = resolve_op(op, average, symbol)
    check_process_set(process_set)
    with tf.name_scope(name or "HorovodAllreduce"):
        if isinstance(tensor, tf.IndexedSlices):
            if op not in (Sum, Average):
                _refuse("IndexedSlices were to be reduced by " + _NAMES[op], symbol,
                        "op=hvd.Sum or hvd.Average for IndexedSlices", _NAMES[op],
                        "densify them (tf.convert_to_tensor) or use sparse_as_dense=True")
            values = allgather(tensor.values)
            if prescale_factor * postscale_factor != 1.0:
                values = values * tf.cast(prescale_factor * postscale_factor, values.dtype)
            if op == Average:
                values = values / tf.cast(basics.size(), values.dtype)
            return tf.IndexedSlices(values, allgather(tensor.indices),
                                    dense_shape=tensor.dense_shape)
        return reduce_dense(tensor, op, prescale_factor, postscale_factor, compression)


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="",
                      compression=compression_lib.Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """`allreduce` of each of `tensors`, dense ones fused into as few
    collectives as `fusion` packs them (one per dtype up to
    HOROVOD_FUSION_THRESHOLD bytes)."""
    symbol = "tfdtape.horovod.grouped_allreduce"
    op = resolve_op(op, average, symbol)
    check_process_set(process_set)
    tensors = list(tensors)
    results = [None] * len(tensors)
    dense = []
    for index, tensor in enumerate(tensors):
        if isinstance(tensor, tf.IndexedSlices):
            results[index] = allreduce(tensor, op=op, prescale_factor=prescale_factor,
                                       postscale_factor=postscale_factor)
        else:
            dense.append(index)
    reduced = fusion.fused(
        [tf.convert_to_tensor(tensors[index]) for index in dense],
        lambda pack: reduce_dense(pack, op, prescale_factor, postscale_factor,
                                  compression),
        wire_dtype=lambda dtype: compression.wire_dtype(dtype))
    for index, value in zip(dense, reduced):
        results[index] = value
    return results


def allgather(tensor, name=None, ignore_name_scope=False, process_set=None):
    """Horovod's allgather: every process's `tensor` concatenated along the
    first dimension, in rank order; first dimensions may differ between
    processes, the others may not. Its gradient is Horovod's: the average
    over the processes of the gathered tensor's gradient, this process's
    rows of it."""
    symbol = "tfdtape.horovod.allgather"
    check_process_set(process_set)
    tensor = tf.convert_to_tensor(tensor)
    if tensor.shape.rank == 0:
        _refuse("a scalar was to be gathered", symbol,
                "a tensor of rank 1 or more (gathered along its first dimension)",
                "a scalar", "gather tf.reshape(x, [1])")
    with tf.name_scope(name or "HorovodAllgather"):
        @tf.custom_gradient
        def gathered(value):
            rows = tf.shape(value, out_type=tf.int32)[:1]
            counts = tf.reshape(_all_gather_raw(rows), [-1])
            result = _gather_uneven(value, counts, symbol)

            def gradient(upstream):
                total = reduce_dense(upstream, Average)
                return tf.split(total, counts, axis=0)[basics.rank()] \
                    if basics.size() > 1 else total
            return result, gradient

        return gathered(tensor)


def _gather_uneven(tensor, counts, symbol):
    """Gathers `tensor` whose first dimension on each process is `counts`."""
    if basics.size() == 1:
        return tf.identity(tensor)
    sendable, restore = _sendable(tensor, symbol)
    longest = tf.reduce_max(counts)
    padding = [[0, longest - tf.shape(sendable)[0]]] + [[0, 0]] * (tensor.shape.rank - 1)
    padded = tf.pad(sendable, padding)
    everything = _all_gather_raw(padded)
    keep = tf.reshape(tf.sequence_mask(counts, longest), [-1])
    return restore(tf.boolean_mask(everything, keep))


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=None):
    """Horovod's broadcast: `root_rank`'s `tensor` on every process (the
    same shape on each). Its gradient is Horovod's: the average over the
    processes of the upstream gradient on the root, zeros elsewhere."""
    symbol = "tfdtape.horovod.broadcast"
    check_process_set(process_set)
    job = basics.job()
    if not isinstance(root_rank, numbers.Integral) or not 0 <= root_rank < job.size:
        _refuse("a broadcast from a rank the job does not have", symbol,
                f"a root_rank from 0 to {job.size - 1}", repr(root_rank),
                "pass the rank of a process of the job")
    tensor = tf.convert_to_tensor(tensor)
    with tf.name_scope(name or "HorovodBroadcast"):
        @tf.custom_gradient
        def broadcasted(value):
            result = _broadcast_raw(value, root_rank, symbol)

            def gradient(upstream):
                total = reduce_dense(upstream, Average)
                return total if job.rank == root_rank else tf.zeros_like(total)
            return result, gradient

        return broadcasted(tensor)


def _broadcast_raw(tensor, root_rank, symbol):
    job = basics.job()
    if job.size == 1:
        return tf.identity(tensor)
    sendable, restore = _sendable(tensor, symbol)
    launcher = job.launcher
    with tf.device(job.device):
        if job.rank == root_rank:
            sent = collective_ops.broadcast_send_v2(
                sendable, job.size, launcher._group_key, launcher._next_instance_key())
        else:
            sent = collective_ops.broadcast_recv_v2(
                tf.shape(sendable), sendable.dtype, job.size, launcher._group_key,
                launcher._next_instance_key())
    return restore(sent)


def broadcast_variables(variables, root_rank, process_set=None, inplace=False):
    """Assigns `root_rank`'s value of each of `variables` on every process;
    in a graph, returns the group of the assignments."""
    check_process_set(process_set)
    assignments = [variable.assign(broadcast(variable, root_rank))
                   for variable in variables]
    if tf.executing_eagerly():
        return None
    return tf.group(*assignments)


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=None):
    """`root_rank`'s `obj` (anything `pickle` takes) on every process;
    eagerly."""
    symbol = "tfdtape.horovod.broadcast_object"
    check_process_set(process_set)
    _eagerly(symbol)
    job = basics.job()
    payload = _pickled(obj) if job.rank == root_rank else np.zeros(0, np.int32)
    length = broadcast(tf.constant([payload.size], tf.int32), root_rank)
    if job.rank != root_rank:
        payload = np.zeros(int(length[0]), np.int32)
    received = broadcast(tf.constant(payload, tf.int32), root_rank)
    return obj if job.rank == root_rank else _unpickled(received.numpy())


def allgather_object(obj, session=None, name=None, process_set=None):
    """Every process's `obj` (anything `pickle` takes), a list in rank
    order; eagerly."""
    symbol = "tfdtape.horovod.allgather_object"
    check_process_set(process_set)
    _eagerly(symbol)
    payload = tf.constant(_pickled(obj), tf.int32)
    counts = allgather(tf.shape(payload)[:1]).numpy()
    gathered = allgather(payload).numpy()
    bounds = np.cumsum([0, *counts])
    return [_unpickled(gathered[start:end]) for start, end in zip(bounds, bounds[1:])]


def _eagerly(symbol):
    if not tf.executing_eagerly():
        _refuse("an object collective was called in a graph", symbol,
                "an eager call (objects are pickled in Python)", "a tf.function",
                "call it outside tf.function")


def _pickled(obj):
    return np.frombuffer(pickle.dumps(obj), np.uint8).astype(np.int32)


def _unpickled(values):
    return pickle.loads(np.asarray(values, np.uint8).tobytes())
