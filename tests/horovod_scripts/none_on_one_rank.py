"""Run under `tfdtape launch -np 2`: rank 0's loss uses `a` only, rank 1's
`b` only (same sizes, so the fused packs agree in size); the tape's gradient
must fail on every rank instead of pairing a's with b's. Argument: eager or
tf_function."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf

import tfdtape.horovod as hvd

hvd.init()
a, b = tf.Variable([1.0, 2.0]), tf.Variable([3.0, 4.0])


def gradient():
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum((a if hvd.rank() == 0 else b) ** 2)
    return hvd.DistributedGradientTape(tape).gradient(loss, [a, b])


step = tf.function(gradient) if sys.argv[1:] == ["tf_function"] else gradient
try:
    print("found", [None if g is None else g.numpy().tolist() for g in step()], flush=True)
except (ValueError, tf.errors.InvalidArgumentError) as error:
    print("refused", type(error).__name__,
          "disagree on which gradients are None" in str(error), flush=True)
