"""Run under `tfdtape launch -np N`: the processes call collectives that
differ (in kind, op, root, dtype, shape, count, name, which gradients are
None (IndexedSlices on one process), or one extra collective); every
process must refuse each of them with the same
error, and the job must go on afterwards. Prints one JSON line per case:
the error's type and the part of its message that names the difference.
Argument: eager or tf_function."""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf

import tfdtape.horovod as hvd

hvd.init()
rank = hvd.rank()
a, b = tf.Variable([1.0, 2.0]), tf.Variable([3.0, 4.0])
column = tf.Variable(tf.ones([2, 1]))  # a's size, not its shape


def none_on_one_rank():
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum((a if rank == 0 else b) ** 2)
    return hvd.DistributedGradientTape(tape).gradient(loss, [a, b])


embedding = tf.Variable(tf.ones([3, 2]))


def slices_on_one_rank():
    """Rank 0's embedding gradient is IndexedSlices, the others' None (the
    check must come before the IndexedSlices' gathers). Eagerly only: in a
    tf.function it is refused alike too, but rank 0's graph took keys for
    its gathers, and the job cannot go on (as after LAST)."""
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(a ** 2)
        if rank == 0:
            loss += tf.reduce_sum(tf.gather(embedding, [0, 2]))
    return hvd.DistributedGradientTape(tape).gradient(loss, [a, embedding])


CASES = {
    "kind": lambda: hvd.allreduce(tf.ones([2])) if rank == 0 else hvd.broadcast(
        tf.ones([2]), 0),
    "op": lambda: hvd.allreduce(tf.ones([2]), op=hvd.Sum if rank == 0 else hvd.Max),
    "root": lambda: hvd.broadcast(tf.ones([2]), rank),
    "dtype": lambda: hvd.allreduce(tf.ones([2], tf.float32 if rank == 0 else tf.float64)),
    "shape": lambda: hvd.allreduce(tf.ones([2 + rank])),
    "trailing": lambda: hvd.allgather(tf.ones([2, 1 + rank])),
    "count": lambda: hvd.grouped_allreduce(
        [tf.ones([4])] if rank == 0 else [tf.ones([2]), tf.ones([2])]),
    "group_shapes": lambda: hvd.grouped_allreduce(
        [tf.ones([2, 3]) if rank == 0 else tf.ones([3, 2]), tf.ones([1])]),
    "variables": lambda: hvd.broadcast_variables([a] if rank == 0 else [column], 0),
    "name": lambda: hvd.allreduce(tf.ones([2]), name=f"loss_{rank}"),
    "integer_average": lambda: hvd.allreduce(tf.ones([3], tf.int32 if rank == 0 else tf.float32)),
    "alltoall_trailing": lambda: hvd.alltoall(tf.ones([2 * hvd.size(), 1 + rank])),
    "reducescatter_dtype": lambda: hvd.reducescatter(
        tf.ones([4], tf.int32 if rank == 0 else tf.float32)),
    "none_on_one_rank": none_on_one_rank,
}
traced = sys.argv[1:] == ["tf_function"]
if not traced:  # traced, rank 0's graph holds the gathers too: like LAST below
    CASES["slices_on_one_rank"] = slices_on_one_rank
CASES["scalar_on_one_rank"] = lambda: hvd.allgather(
    tf.constant(1.0) if rank == 0 else tf.ones([1]))
CASES["splits_on_one_rank"] = lambda: hvd.alltoall(
    tf.ones([hvd.size()]), splits=[hvd.size() + 1] + [0] * (hvd.size() - 1) if rank == 0
    else [1] * hvd.size())
CASES["scalars_on_every_rank"] = lambda: hvd.reducescatter(tf.constant(1.0))
LAST = ("extra", lambda: ([hvd.allreduce(tf.ones([3]))] if rank == 0 else []) + [
    hvd.allreduce(tf.ones([2]))])
"""One more collective on rank 0, paired with the next one of the others:
last, as the job cannot go on after it in a tf.function (each process's
graph took as many keys as it has collectives)."""

for name, case in [*CASES.items(), LAST]:
    def call(case=case):
        case()  # Nothing returned: a tf.function may not return an Operation.
    try:
        (tf.function(call) if traced else call)()
        found = {"case": name, "refused": None}
    except (tf.errors.FailedPreconditionError, tf.errors.InvalidArgumentError,
            ValueError) as error:
        text = str(error)
        start = text.index("tfdtape: ")
        found = {"case": name, "refused": type(error).__name__,
                 "says": text[start:text.index(" (tfdtape.horovod.", start)]}
    print(json.dumps(found), flush=True)
    if name in CASES:
        after = (tf.function(hvd.allreduce) if traced else hvd.allreduce)(
            tf.constant([float(rank)]), op=hvd.Sum)
        assert after.numpy().tolist() == [sum(range(hvd.size()))], after
