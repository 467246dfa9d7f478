"""Bytes the chief holds, handed to every worker of a strategy of several.

`from_chief` is how a worker without the chief's files gets them: a
backup restored on workers whose disks are separate
(`tfdtape.keras3_saving`). It goes through the strategy's own collectives,
two all-reduces, so every worker must call it at the same point with the
same number of slots: the first sums a header (each slot's length plus one,
0 for a slot the chief has not filled) to which only the chief's first
device contributes, the second sums the bytes packed as int32 the same
way. Integer sums with zeros are exact: every worker gets the chief's
bytes, bit for bit.
"""

import numpy as np
from tensorflow.python.distribute import reduce_util
from tensorflow.python.distribute import values as values_lib
from tensorflow.python.framework import constant_op
from tensorflow.python.framework import ops
from tensorflow.python.ops import array_ops

from tfdtape import compat

_WORD = 4
"""Bytes per int32 of the packed payload."""


def is_chief(strategy):
    """Whether this process is the chief of `strategy`'s job (the worker
    that writes checkpoints)."""
    return bool(strategy.extended.should_checkpoint)


def from_chief(strategy, slots):
    """The chief's `slots` (a list of bytes or None), on every worker.

    Every worker passes a list of the same length; what the others put in
    it is ignored. Returns a new list: the chief's bytes in each slot it
    filled, None in the others.
    """
    chief = is_chief(strategy)
    header = np.array([0 if not chief or slot is None else len(slot) + 1 for slot in slots],
                      np.int64)
    header = _summed(strategy, header, chief)
    lengths = [int(entry) - 1 for entry in header]
    total = sum(length for length in lengths if length > 0)
    if total == 0:
        return [b"" if length == 0 else None for length in lengths]
    packed = b"".join(slot for slot in slots if slot) if chief else b""
    padded = -total % _WORD
    words = np.frombuffer(packed + b"\0" * padded, np.int32) if chief else \
        np.zeros((total + padded) // _WORD, np.int32)
    payload = _summed(strategy, words, chief).tobytes()
    received, offset = [], 0
    for length in lengths:
        if length < 0:
            received.append(None)
            continue
        received.append(payload[offset:offset + length])
        offset += length
    return received


def _summed(strategy, array, chief):
    """The sum over every replica of the job of `array` from the chief's
    first device and zeros from every other replica, as NumPy."""
    devices = strategy.extended.worker_devices
    copies = []
    with compat.stop_recording():
        for index, device in enumerate(devices):
            with ops.device(device):
                value = constant_op.constant(array)
                copies.append(value if chief and index == 0 else array_ops.zeros_like(value))
        reduced = strategy.extended.batch_reduce_to(
            reduce_util.ReduceOp.SUM, [(values_lib.PerReplica(tuple(copies)), devices[0])])
    return strategy.experimental_local_results(reduced[0])[0].numpy()
