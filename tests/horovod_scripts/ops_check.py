"""Run under `tfdtape launch -np N`: every tfdtape.horovod operation on
this rank, its results printed as one JSON object (the test compares them
with their closed forms and across ranks)."""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import tensorflow as tf

import tfdtape.horovod as hvd
import tfdtape.horovod.keras as hvd_keras

hvd.init()
rank, size = hvd.rank(), hvd.size()
found = {"rank": rank, "size": size, "local": [hvd.local_rank(), hvd.local_size()]}
base = tf.constant([rank + 1.0, 2.0 * (rank + 1)])
for name, op in [("average", hvd.Average), ("sum", hvd.Sum), ("min", hvd.Min),
                 ("max", hvd.Max), ("product", hvd.Product)]:
    found[name] = hvd.allreduce(base, op=op).numpy().tolist()
found["scaled"] = hvd.allreduce(base, op=hvd.Sum, prescale_factor=2.0,
                                postscale_factor=0.25).numpy().tolist()
found["int_sum"] = hvd.allreduce(tf.constant([rank, 1]), op=hvd.Sum).numpy().tolist()
found["int_scaled"] = hvd.allreduce(tf.constant([rank + 1, 3]), op=hvd.Sum,
                                    postscale_factor=0.5).numpy().tolist()
found["int_average"] = hvd.allreduce(tf.constant([rank + 1, -3 * rank], tf.int64)
                                   ).numpy().tolist()
# alltoall: rank r sends j + 1 rows of value 10 * r + j to rank j (and keeps
# one row unsent); without splits, each rank's 2 * size rows in equal parts.
rows = tf.constant([[10.0 * rank + j] for j in range(size) for _ in range(j + 1)] + [[-1.0]])
exchanged, received = hvd.alltoall(rows, splits=[j + 1 for j in range(size)])
found["alltoall"] = [exchanged.numpy().ravel().tolist(), received.numpy().tolist()]
found["alltoall_equal"] = hvd.alltoall(
    tf.range(2 * size, dtype=tf.int32) + 100 * rank).numpy().tolist()
# Splits on some processes only (Horovod's: the others send equal parts).
given = {0: [2] * size, 1: []}.get(rank)
found["alltoall_mixed"] = hvd.alltoall(tf.range(2 * size, dtype=tf.int32) + 100 * rank,
                                       splits=given)
found["alltoall_mixed"] = [t.numpy().tolist() for t in found["alltoall_mixed"]] \
    if given is not None else found["alltoall_mixed"].numpy().tolist()
found["alltoall_traced"] = tf.function(lambda x, s: hvd.alltoall(x, s)[0])(
    rows, tf.constant([j + 1 for j in range(size)])).numpy().ravel().tolist()
x = tf.Variable(rows)
with tf.GradientTape() as tape:
    y = tf.reduce_sum(hvd.alltoall(x, splits=[j + 1 for j in range(size)])[0] * (rank + 1.0))
found["alltoall_gradient"] = tape.gradient(y, x).numpy().ravel().tolist()
# reducescatter of 2 * size + 1 rows (uneven: rank 0 keeps one more).
scatter = tf.reshape(tf.range(2 * size + 1, dtype=tf.float32), [-1, 1]) * (rank + 1)
found["reducescatter"] = [hvd.reducescatter(scatter, op=op).numpy().ravel().tolist()
                          for op in (hvd.Sum, hvd.Average)]
found["grouped_reducescatter"] = [t.numpy().tolist() for t in hvd.grouped_reducescatter(
    [tf.constant([rank, 1, 5] * size), scatter[:size, 0]], op=hvd.Average)]
x = tf.Variable(scatter)
with tf.GradientTape() as tape:
    y = tf.reduce_sum(hvd.reducescatter(x, op=hvd.Sum) * (rank + 1.0))
found["reducescatter_gradient"] = tape.gradient(y, x).numpy().ravel().tolist()
found["gathered"] = hvd.allgather(tf.fill((rank + 1, 2), float(rank))).numpy().tolist()
found["grouped_gathered"] = [t.numpy().tolist() for t in hvd.grouped_allgather(
    [tf.fill((rank + 1,), rank), tf.constant([[float(rank)]])])]
found["as_tensors"] = [int(op()) for op in (hvd.rank_op, hvd.size_op, hvd.local_rank_op,
                                            hvd.local_size_op)]
found["gathered_bool"] = hvd.allgather(tf.constant([rank % 2 == 0])).numpy().tolist()
found["broadcast"] = hvd.broadcast(tf.constant([rank * 10.0, 1.0]), size - 1).numpy().tolist()
found["object"] = hvd.broadcast_object({"from": rank, "text": "x" * rank}, root_rank=1)
found["objects"] = hvd.allgather_object(("rank", rank))
slices = hvd.allreduce(tf.IndexedSlices(tf.constant([[float(rank)]]), tf.constant([rank]),
                                        tf.constant([size, 1])))
found["slices"] = [slices.values.numpy().tolist(), slices.indices.numpy().tolist()]
grouped = hvd.grouped_allreduce([base, tf.constant([[rank * 1.0]]), tf.constant([rank])],
                                op=hvd.Sum)
found["grouped"] = [g.numpy().tolist() for g in grouped]


@tf.function
def traced(x):
    return hvd.allreduce(x, op=hvd.Sum), hvd.allgather(tf.reshape(x, [-1, 1]))


summed, gathered = traced(base)
found["traced"] = [summed.numpy().tolist(), gathered.numpy().tolist()]

x = tf.Variable([1.0, 2.0])
with tf.GradientTape() as tape:
    y = tf.reduce_sum(hvd.allreduce(x * (rank + 1.0), op=hvd.Sum))
found["allreduce_gradient"] = tape.gradient(y, x).numpy().tolist()

# Local gradients (Horovod's partial tape and optimizers): rank r's
# gradients are r + 1; the local ones stay r + 1, divided by the size.
w, v = tf.Variable([0.0]), tf.Variable([0.0])
with tf.GradientTape() as tape:
    loss = (rank + 1.0) * (w + v)
tape = hvd.PartialDistributedGradientTape(tape)
tape.register_local_source(w)
local, shared = tape.get_local_and_global_gradients(loss, [w, v])
found["local_and_global"] = [[(s is w, float(g[0])) for s, g in local],
                             [(s is v, float(g[0])) for s, g in shared]]
optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(1.0))
optimizer.register_local_var(w)
optimizer.apply_gradients([(tf.constant([rank + 1.0]), w), (tf.constant([rank + 1.0]), v)])
layer = tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")
layer.build((None, 1))
partial = hvd_keras.PartialDistributedOptimizer(tf.keras.optimizers.SGD(1.0),
                                                local_layers=layer)
u = tf.Variable([0.0])
partial.apply_gradients([(tf.fill((1, 1), rank + 1.0), layer.kernel),
                         (tf.constant([rank + 1.0]), u)])
found["local_optimizers"] = [float(w[0]), float(v[0]), float(layer.kernel[0, 0]), float(u[0])]

# Training: a linear model on the global batch, each rank its rows.
features = np.arange(6 * size * 3, dtype=np.float32).reshape(6 * size, 3) / 10.0
labels = (features @ np.array([[1.0], [-2.0], [0.5]], np.float32)) + 1.0
rows = slice(6 * rank, 6 * (rank + 1))


def train(mode):
    """Three SGD steps from different weights per rank, broadcast from 0:
    by DistributedGradientTape, or (mode "keras_apply") a plain tape and
    the DistributedOptimizer's `apply` (Keras 3; `apply_gradients` before)."""
    weights = tf.Variable(tf.fill((3, 1), float(rank)))
    bias = tf.Variable([0.0])
    hvd.broadcast_variables([weights, bias], root_rank=0)
    found.setdefault("broadcast_variables", weights.numpy().ravel().tolist())
    optimizer = hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.1))

    def step():
        with tf.GradientTape() as tape:
            error = features[rows] @ weights + bias - labels[rows]
            loss = tf.reduce_mean(error * error)
        if mode == "keras_apply":
            gradients = tape.gradient(loss, [weights, bias])
            if hasattr(optimizer, "stateless_apply"):
                optimizer.apply(gradients, [weights, bias])
            else:
                optimizer.apply_gradients(zip(gradients, [weights, bias]))
            return
        tape = hvd.DistributedGradientTape(tape)
        gradients = tape.gradient(loss, [weights, bias])
        weights.assign_sub(0.1 * gradients[0])
        bias.assign_sub(0.1 * gradients[1])
    if mode == "tf_function":
        step = tf.function(step)
    for _ in range(3):
        step()
    found[f"trained_{mode}"] = [weights.numpy().ravel().tolist(), bias.numpy().tolist()]


for mode in ("eager", "tf_function", "keras_apply"):
    train(mode)


@tf.function(jit_compile=True)
def compiled(x):
    return hvd.allreduce(x)


try:
    compiled(base)
except ValueError as error:
    found["xla"] = str(error)
with tf.Graph().as_default():  # TensorFlow 1's, for a Session
    try:
        hvd.allreduce(tf.constant([1.0]))
    except NotImplementedError as error:
        found["session_graph"] = str(error)


@tf.function
def fused_step(variables):
    with tf.GradientTape() as tape:
        loss = tf.add_n([tf.reduce_sum(v * v) for v in variables])
    return hvd.DistributedGradientTape(tape).gradient(loss, variables)


variables = [tf.Variable(tf.ones((2, 2))), tf.Variable([1.0]), tf.Variable(tf.ones(3)),
             tf.Variable(2.0)]
graph = fused_step.get_concrete_function(variables).graph
found["collectives_per_step"] = sorted(op.type for op in graph.get_operations()
                                      if op.type.startswith("Collective"))
found["fused_gradients"] = [g.numpy().tolist() for g in fused_step(variables)]
print(json.dumps(found), flush=True)
