"""Run under `tfdtape launch -np N [PASSES EPOCHS [OPTIMIZER [AS_JOB_OF]]]`:
Keras `fit` with tfdtape.horovod.keras's DistributedOptimizer (accumulating
PASSES backward passes per step, default 1: mini-batches of 6 // PASSES of
each rank's 6 rows; OPTIMIZER sgd, the default, or adam) and callbacks, for
EPOCHS (default 3), each rank starting from other weights and training on
its rows of the global batch; prints the weights, the averaged losses and
the optimizer's iterations as one JSON object.

With KERAS_FIT_POLICY=mixed_float16 in the environment, under that dtype
policy (`compile` wraps the optimizer in a LossScaleOptimizer); the JSON
then has the final loss scale too; with KERAS_FIT_WRAP_LOSS_SCALE=1 as well,
the DistributedOptimizer wraps a LossScaleOptimizer the script makes.

With AS_JOB_OF M, run alone (no launcher): one device training what a job
of M processes trains, the global mini-batches in the job's order, from
rank 0's weights (the reference)."""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import tensorflow as tf

import tfdtape.horovod.keras as hvd

hvd.init()
policy = os.environ.get("KERAS_FIT_POLICY")
if policy:
    tf.keras.mixed_precision.set_global_policy(policy)
arguments = sys.argv[1:]
passes, epochs = (int(arguments[0]), int(arguments[1])) if len(arguments) > 1 else (1, 3)
optimizer_name = arguments[2] if len(arguments) > 2 else "sgd"
as_job_of = int(arguments[3]) if len(arguments) > 3 else None
rank, size = hvd.rank(), as_job_of or hvd.size()
features = np.arange(6 * size * 3, dtype=np.float32).reshape(6 * size, 3) / 10.0
labels = features @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 1.0
batch = 6 // passes
if as_job_of:  # mini-batch k of every rank, k after k
    order = [6 * r + batch * k + i for k in range(passes) for r in range(size)
             for i in range(batch)]
    rows, batch = order, batch * size
else:
    rows = list(range(6 * rank, 6 * (rank + 1)))
model = tf.keras.Sequential([
    tf.keras.Input((3,)),
    tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.Constant(float(rank)),
                          bias_initializer=tf.keras.initializers.Constant(float(rank)))])
optimizer = {"sgd": lambda: tf.keras.optimizers.SGD(0.1),
             "adam": lambda: tf.keras.optimizers.Adam(0.1)}[optimizer_name]()
if os.environ.get("KERAS_FIT_WRAP_LOSS_SCALE"):
    optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
model.compile(hvd.DistributedOptimizer(optimizer, backward_passes_per_step=passes),
              loss="mse")
history = model.fit(features[rows], labels[rows], batch_size=batch, epochs=epochs,
                    shuffle=False,
                    verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                          hvd.callbacks.MetricAverageCallback()])
kernel, bias = model.get_weights()
scale = getattr(model.optimizer, "dynamic_scale", None)
if scale is None and hasattr(model.optimizer, "loss_scale"):
    scale = model.optimizer.loss_scale
print(json.dumps({"scale": None if scale is None else float(scale),
                  "rank": rank, "weights": [kernel.ravel().tolist(), bias.tolist()],
                  "loss": history.history["loss"],
                  "optimizer": type(model.optimizer).__name__,
                  "keras": type(model.optimizer).__module__.split(".")[0],
                  "iterations": int(model.optimizer.iterations)}), flush=True)
