"""Collectives of tensors with no element (a last batch with no rows), made
from empty NumPy arrays, in every dtype Horovod reduces, eagerly and in a
tf.function, then one collective with elements (the job still in step).
Prints one JSON object: each result's shape and dtype, and the last sum."""

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
last = hvd.allreduce(tf.constant([float(hvd.rank() + 1)]), op=hvd.Sum)
print(json.dumps({"results": found, "last": float(last.numpy()[0])}))
