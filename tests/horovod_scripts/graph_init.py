"""Run under `tfdtape launch -np N`: `hvd.init()` called first while a
TensorFlow 1 graph is the default (as Horovod's test_tensorflow.py runs each
test in graph mode first), then an eager all-reduce. Prints one JSON object:
the rank and the sum over the ranks of [1, 2] * (rank + 1)."""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf

import tfdtape.horovod as hvd

with tf.Graph().as_default():
    hvd.init()
summed = hvd.allreduce(tf.constant([1.0, 2.0]) * (hvd.rank() + 1), op=hvd.Sum)
print(json.dumps({"rank": hvd.rank(), "sum": summed.numpy().tolist()}))
