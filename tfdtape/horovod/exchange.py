"""Horovod's `alltoall`, `reducescatter` and `grouped_reducescatter` on
TensorFlow's collectives, each checked across the processes first
(`negotiation`), with Horovod's gradients.

Collectives per call (in a job of several processes): `alltoall`, the check
(an all-gather of descriptions), an all-gather of the splits (each process
may give its own, or none: equal parts, as Horovod allows) and the exchange
(TensorFlow's all-to-all where the release has it, else an all-gather);
`reducescatter` and `grouped_reducescatter`, the check and the all-reduces
`fusion` packs (one per dtype up to the fusion threshold), of which each
process keeps its rows.
"""

import numpy as np
import tensorflow as tf

from tfdtape import errors
from tfdtape.horovod import collectives
from tfdtape.horovod import compression as compression_lib
from tfdtape.horovod import fusion
from tfdtape.horovod import negotiation
from tfdtape.horovod import ops
from tfdtape.horovod.collectives import Average
from tfdtape.horovod.collectives import Sum

_SCATTERABLE = (Sum, Average)


def _invalid(*args):
    """tf.errors.InvalidArgumentError of Horovod's (errors.message's args)."""
    return tf.errors.InvalidArgumentError(None, None, errors.message(*args))


def _rows(tensor):
    """`tensor`'s first dimension (1 for a scalar, which is refused)."""
    if tensor.shape.rank == 0:
        return tf.constant(1)
    return tf.shape(tensor, out_type=tf.int32)[0]


def _splits_refusal(tensor, splits, symbol):
    """(the code in negotiation.REFUSALS of what is wrong with `tensor` and
    `splits` on this process, an int or int32 scalar tensor; the error)."""
    size = collectives.size()
    if tensor.shape.rank == 0:
        return ops.scalar_refusal(
            [tensor], "a scalar to exchange", "a scalar was to be exchanged", symbol,
            "a tensor of rank 1 or more (split along its first dimension)",
            "exchange tf.reshape(x, [1])")
    if splits is None:
        code = negotiation.REFUSALS.index(
            "a first dimension that does not split evenly over the processes")
        error = _invalid(
            "alltoall without splits of a first dimension that does not split evenly",
            symbol, f"a first dimension that is a multiple of the job's size, {size}",
            "another", "pass splits, one count of rows per process")
        uneven = tf.not_equal(_rows(tensor) % size, 0)
    else:
        code = negotiation.REFUSALS.index("splits that do not fit the tensor")
        error = _invalid(
            "alltoall splits that do not fit the tensor", symbol,
            f"{size} integer counts of rows (one per process), none negative, summing "
            "to at most the tensor's first dimension", _said(splits, tensor),
            "pass splits with one count of rows for each process")
        if not splits.dtype.is_integer or splits.shape.rank != 1 or (
                splits.shape[0] is not None and splits.shape[0] != size):
            return code, error
        uneven = tf.logical_or(tf.reduce_any(splits < 0),
                               tf.reduce_sum(splits) > _rows(tensor))
    if tf.executing_eagerly():
        return (code if bool(uneven) else 0), error
    if tf.get_static_value(uneven) is not None:
        return (code if tf.get_static_value(uneven) else 0), error
    return tf.where(uneven, code, 0), error


def _said(splits, tensor):
    """`splits` and `tensor`'s first dimension in words, for the error."""
    if tf.executing_eagerly():
        return (f"splits {np.asarray(splits.numpy()).tolist()} ({splits.dtype.name}) for "
                f"{tensor.shape[0] if tensor.shape.rank else 'no'} rows")
    return f"splits of {splits.dtype.name}, shape {splits.shape}"


@ops.in_process_set
def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=None):
    """Horovod's alltoall: `tensor`'s first dimension cut into `splits[i]`
    rows for process i (without `splits`, equal parts: the first dimension
    must be a multiple of the job's size); returns the rows every process
    sent this one, in rank order, and where `splits` was given also the
    number received from each (int32). The dtype and the dimensions after
    the first must agree between the processes (else
    tf.errors.FailedPreconditionError on every process); bad `splits` are
    tf.errors.InvalidArgumentError on every process, as Horovod's. Its
    gradient is Horovod's: the alltoall of the upstream gradient back (zeros
    for rows that `splits` left unsent)."""
    symbol = "tfdtape.horovod.alltoall"
    tensor = tf.convert_to_tensor(tensor)
    if tensor.dtype.is_complex:
        raise ValueError(errors.message(
            "a complex tensor was to be exchanged", symbol, "a real, integer or bool "
            "tensor (TensorFlow's all-to-all carries no complex numbers)",
            tensor.dtype.name, "exchange tf.math.real(x) and tf.math.imag(x)"))
    given = splits is not None
    if given:
        splits = tf.convert_to_tensor(splits)
        if splits.shape.rank == 1 and splits.shape[0] == 0:
            splits = None  # Horovod's empty splits: equal parts
    with tf.name_scope(name or "HorovodAlltoall"):
        @tf.custom_gradient
        def exchanged(value):
            output, received = _exchanged(value, splits, symbol, name)

            process_set_id = collectives.current_set()

            def gradient(upstream, _received_upstream=None):
                with collectives.resumed(process_set_id):
                    back = alltoall(upstream, received, name=name)[0]
                unsent = tf.shape(value)[0] - tf.shape(back)[0]  # rows splits left out
                return tf.pad(back, [[0, unsent]] + [[0, 0]] * (value.shape.rank - 1))
            return (output, received), gradient

        output, received = exchanged(tensor)
    return (output, received) if given else output


def _exchanged(tensor, splits, symbol, name):
    """(the rows received, how many from each process), once every process
    agreed (`negotiation`) and none refused its splits."""
    size, rank = collectives.size(), collectives.rank()
    code, error = refusal = _splits_refusal(tensor, splits, symbol)
    everyone = ops.negotiated("alltoall", [tensor], symbol, name=name, rows=_rows(tensor),
                              refusal=refusal)
    if everyone is None and isinstance(code, tf.Tensor):  # a job of one, traced
        with tf.control_dependencies([tf.debugging.Assert(tf.equal(code, 0), [str(error)])]):
            tensor = tf.identity(tensor)
    tensor = ops.stand_in(tensor)
    if splits is None:
        own = tf.fill([size], _rows(tensor) // size)
    elif isinstance(code, int) and code:  # refused when run: a stand-in
        own = tf.zeros([size], tf.int32)
    else:
        own = tf.cast(splits, tf.int32)
        if isinstance(code, tf.Tensor):
            own = tf.where(tf.equal(code, 0), own, tf.zeros_like(own))
    # sent[i, j]: the rows process i sends process j.
    sent = tf.reshape(ops.after(everyone, collectives.all_gather(ops.after(everyone, own))),
                      [size, size]) if size > 1 else own[None]
    received = sent[:, rank]
    longest = tf.reduce_max(sent)
    sendable, restore = collectives.sendable(tensor, symbol)
    kept = sendable[:tf.reduce_sum(own)]
    padded = tf.RaggedTensor.from_row_lengths(kept, own).to_tensor(
        shape=tf.concat([[size, longest], tf.shape(sendable)[1:]], 0))
    arrived = tf.reshape(_never_empty(collectives.all_to_all, ops.after(everyone, padded)),
                         tf.shape(padded))
    output = tf.boolean_mask(arrived, tf.sequence_mask(received, longest))
    return restore(output), received


def _never_empty(exchange, rows):
    """`exchange` of `rows` (first dimension the job's size) flattened, one
    element more per row: TensorFlow 2.21's all-to-all of no elements
    crashes the process. Returns the exchanged rows, flat."""
    flat = tf.reshape(rows, [collectives.size(), -1])
    return exchange(tf.pad(flat, [[0, 0], [0, 1]]))[:, :-1]


@ops.in_process_set
def reducescatter(tensor, device_dense="", compression=compression_lib.Compression.none,
                  op=Average, name=None, process_set=None, ignore_name_scope=False,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Horovod's reducescatter: `tensor` reduced over the processes by `op`
    (Average or Sum), of which this process keeps its rows: the first
    dimension cut in the job's size of parts, the first (dim % size)
    processes one row more, as Horovod cuts it. The same dtype and shape
    on every process (else tf.errors.FailedPreconditionError on every
    process). Its gradient is Horovod's: the all-gather of the upstream
    gradient, times the size for Sum, and times the scale factors."""
    symbol = "tfdtape.horovod.reducescatter"
    with tf.name_scope(name or "HorovodReducescatter"):
        return _scattered([tensor], op, prescale_factor, postscale_factor, compression,
                          "reducescatter", symbol, name)[0]


@ops.in_process_set
def grouped_reducescatter(tensors, device_dense="",
                          compression=compression_lib.Compression.none, op=Average,
                          process_set=None, prescale_factor=1.0, postscale_factor=1.0):
    """`reducescatter` of each of `tensors`, checked once for all of them
    and fused into as few all-reduces as `fusion` packs them."""
    symbol = "tfdtape.horovod.grouped_reducescatter"
    return _scattered(list(tensors), op, prescale_factor, postscale_factor, compression,
                      "grouped_reducescatter", symbol, None)


def _check_op(op, symbol):
    """Refuses an op other than Sum and Average, as Horovod does.

    Raises:
        tf.errors.AbortedError: Horovod's error for it.
    """
    op = ops.resolve_op(op, None, symbol)
    if op not in _SCATTERABLE:
        raise tf.errors.AbortedError(None, None, errors.message(
            "a reducescatter by " + collectives.OP_NAMES[op], symbol,
            "op=hvd.Average or hvd.Sum", collectives.OP_NAMES[op],
            "reduce with hvd.allreduce and keep this rank's rows"))
    return op


def _scattered(tensors, op, prescale_factor, postscale_factor, compression, kind, symbol,
               name):
    op = _check_op(op, symbol)
    tensors = [tf.convert_to_tensor(tensor) for tensor in tensors]
    ops.check_averageable(tensors, op, symbol)
    refusal = ops.scalar_refusal(
        tensors, "a scalar to reduce-scatter", "a scalar was to be reduce-scattered", symbol,
        "tensors of rank 1 or more (scattered along their first dimension)",
        "reduce it with hvd.allreduce")

    if not tensors:  # every process must issue it still (the check)
        ops.negotiated(kind, [], symbol, op=op)
        return []

    @tf.custom_gradient
    def scattered(*values):
        everyone = ops.negotiated(kind, list(values), symbol, op=op, name=name,
                                  refusal=refusal)
        reduced = fusion.fused(
            [ops.after(everyone, ops.stand_in(value)) for value in values],
            lambda pack: ops.reduce_dense(pack, op, prescale_factor, postscale_factor,
                                     compression, symbol),
            wire_dtype=compression.wire_dtype)
        results = [_own_rows(value) for value in reduced]

        process_set_id = collectives.current_set()

        def gradient(*upstream):
            with collectives.resumed(process_set_id):
                factor = prescale_factor * postscale_factor * (
                    collectives.size() if op == Sum else 1)
                return [ops.allgather(_times(grad, factor)) for grad in upstream]
        return results, gradient

    return list(scattered(*tensors))


def _times(value, factor):
    return value if factor == 1 else value * ops.factor_in(factor, value.dtype)


def _own_rows(value):
    """This process's rows of `value`: the first dimension cut into the
    job's size of parts, the first (dim % size) one row longer."""
    size, rank = collectives.size(), collectives.rank()
    rows = _rows(value)
    short, extra = rows // size, rows % size
    start = rank * short + tf.minimum(rank, extra)
    length = short + tf.cast(rank < extra, tf.int32)
    return value[start:start + length]
