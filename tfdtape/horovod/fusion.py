"""Tensor fusion, as Horovod's: small tensors of one dtype packed into one
collective up to a size threshold, so that a step issues a few collectives
instead of one per gradient.

The threshold is HOROVOD_FUSION_THRESHOLD bytes (Horovod's default 64 MiB;
0 turns fusion off: one collective per tensor).
"""

import os

import tensorflow as tf

DEFAULT_THRESHOLD = 64 * 1024 * 1024


def threshold():
    """The fusion threshold in bytes, from HOROVOD_FUSION_THRESHOLD.

    Raises:
        ValueError: it is set to something other than a whole number >= 0.
    """
    text = os.environ.get("HOROVOD_FUSION_THRESHOLD")
    if text is None:
        return DEFAULT_THRESHOLD
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        from tfdtape import errors
        raise ValueError(errors.message(
            "HOROVOD_FUSION_THRESHOLD is not a size", "tfdtape.horovod fusion",
            "a whole number of bytes, 0 or more", repr(text),
            "set it to bytes (67108864 for Horovod's default) or unset it"))
    return value


def packs(tensors, wire_dtype=lambda dtype: dtype):
    """The indices of `tensors` in packs: one dtype each (as sent:
    `wire_dtype`), each under the threshold in bytes (a tensor larger than
    it alone), in order of first appearance."""
    limit = threshold()
    open_packs = {}  # dtype -> (indices, bytes)
    done = []
    for index, tensor in enumerate(tensors):
        dtype = wire_dtype(tensor.dtype)
        size = (tensor.shape.num_elements() or 0) * dtype.size
        if not tensor.shape.is_fully_defined() or limit == 0:
            done.append([index])
            continue
        indices, used = open_packs.get(dtype, ([], 0))
        if indices and used + size > limit:
            done.append(indices)
            indices, used = [], 0
        open_packs[dtype] = (indices + [index], used + size)
    done.extend(indices for indices, _ in open_packs.values())
    return sorted(done)


def fused(tensors, reduce, wire_dtype=lambda dtype: dtype):
    """`reduce` (a tensor -> tensor collective) of each of `tensors`,
    through one call per pack (`packs`)."""
    results = [None] * len(tensors)
    for indices in packs(tensors, wire_dtype):
        if len(indices) == 1:
            results[indices[0]] = reduce(tensors[indices[0]])
            continue
        shapes = [tensors[index].shape for index in indices]
        packed = tf.concat([tf.reshape(tensors[index], [-1]) for index in indices], 0)
        pieces = tf.split(reduce(packed), [shape.num_elements() for shape in shapes])
        for index, piece, shape in zip(indices, pieces, shapes):
            results[index] = tf.reshape(piece, shape)
    return results
