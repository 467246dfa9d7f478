"""Tensors TensorFlow's collectives do not take as they are: tensors with
no element (a last batch with no rows), made from empty NumPy arrays, in
every dtype Horovod reduces, eagerly and in a tf.function; bfloat16
gathered, broadcast and exchanged (TensorFlow's gather, broadcast and
all-to-all refuse the dtype); then one collective with elements (the job
still in step). Prints one JSON object: each result's shape and dtype, the
bfloat16 results' values, and the last sum."""

import json

import numpy as np
import tensorflow as tf

import tfdtape.horovod as hvd

hvd.init()
found = []
for dtype in (np.float16, np.float32, np.float64, np.int32, np.int64):
    empty = tf.constant(np.empty((0, 3), dtype))
    traced = tf.function(lambda tensor: hvd.allreduce(tensor, op=hvd.Sum))
    unknown = tf.function(lambda tensor: hvd.allgather(tensor),
                          input_signature=[tf.TensorSpec([None, 3], dtype)])
    for name, result in (("allreduce", hvd.allreduce(empty, op=hvd.Sum)),
                         ("average", hvd.allreduce(empty) if dtype != np.int64 else empty),
                         ("allgather", hvd.allgather(empty)),
                         ("broadcast", hvd.broadcast(empty, root_rank=hvd.size() - 1)),
                         ("traced", traced(empty)), ("unknown", unknown(empty))):
        found.append([name, np.dtype(dtype).name, result.shape.as_list(),
                      result.dtype.name])
mine = tf.constant([[hvd.rank() + 0.5, -1.25]] * (hvd.rank() + 1), tf.bfloat16)
moved = {"allgather": hvd.allgather(mine), "broadcast": hvd.broadcast(mine[:1], root_rank=1),
         "alltoall": hvd.alltoall(tf.concat([mine[:1]] * hvd.size(), 0)),
         "traced": tf.function(hvd.allgather)(mine)}
bfloat16 = {name: [result.dtype.name, np.asarray(result, np.float32).tolist()]
            for name, result in moved.items()}
# bfloat16 bits moved unchanged: NaNs with payloads and signs, -inf, a subnormal
patterns = tf.constant([0x7F81, 0xFFFF, 0x7FC0, 0xFF80, 0x0001], tf.uint16)
bits = tf.bitcast(tf.bitcast(patterns, tf.int16), tf.bfloat16)
gathered_bits = tf.bitcast(hvd.allgather(bits), tf.uint16).numpy().tolist()
any_rank = tf.function(hvd.allgather, input_signature=[tf.TensorSpec(None, tf.float32)])
unknown_rank = any_rank(tf.ones([hvd.rank() + 1, 2])).shape.as_list()
last = hvd.allreduce(tf.constant([float(hvd.rank() + 1)]), op=hvd.Sum)
print(json.dumps({"results": found, "bfloat16": bfloat16, "bits": gathered_bits,
                  "unknown_rank": unknown_rank, "last": float(last.numpy()[0])}))
