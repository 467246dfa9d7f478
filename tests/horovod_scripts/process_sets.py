"""Run under `tfdtape launch -np 4`: collectives among process sets (even
and odd ranks given to init, [0, 1, 3] added later), printed as one JSON
object per rank."""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf

import tfdtape.horovod as hvd

even, odd = hvd.ProcessSet([0, 2]), hvd.ProcessSet([1, 3])
hvd.init(process_sets=[even, odd])
rank = hvd.rank()
mine, other = (even, odd) if rank % 2 == 0 else (odd, even)
found = {"set": [mine.ranks, mine.rank(), mine.size(), int(hvd.process_set_included_op(
    mine.process_set_id))]}
found["sum"] = hvd.allreduce(tf.fill([2], rank + 1.0), op=hvd.Sum,
                             process_set=mine).numpy().tolist()
found["gathered"] = hvd.grouped_allgather([tf.fill([rank + 1], float(rank))],
                                          process_set=mine)[0].numpy().tolist()
found["gathered"] = [found["gathered"][:mine.ranks[0] + 1], found["gathered"][mine.ranks[0] + 1:]]
found["broadcast"] = hvd.broadcast(tf.fill([3], float(rank)), mine.ranks[1],
                                   process_set=mine).numpy().tolist()
found["alltoall"] = hvd.alltoall(tf.constant([10 * rank, 10 * rank + 1]),
                                 process_set=mine).numpy().tolist()
found["reducescatter"] = hvd.reducescatter(tf.constant([float(rank), rank + 2.0]),
                                           op=hvd.Sum, process_set=mine).numpy().tolist()
w = tf.Variable([1.0])
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(w * (rank + 1.0))
found["tape"] = hvd.DistributedGradientTape(tape, process_set=mine).gradient(
    loss, [w])[0].numpy().tolist()
try:
    hvd.allreduce(tf.constant([1.0]), process_set=other)
except tf.errors.InvalidArgumentError as error:
    found["foreign"] = str(error)
try:
    hvd.broadcast(tf.ones([1]), other.ranks[0], process_set=mine)
except ValueError as error:
    found["root_outside"] = str(error)
if rank == 1 and hasattr(tf.keras.Model, "export"):  # Keras 3: rank 0 writes
    import warnings
    model = tf.keras.Sequential([tf.keras.Input((1,)), tf.keras.layers.Dense(1)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.save(os.path.join(os.environ["OUT"], "rank1.keras"))
    found["save_warning"] = [str(w.message) for w in caught if "rank 0 writes" in
                             str(w.message)]
    found["saved"] = os.path.exists(os.path.join(os.environ["OUT"], "rank1.keras"))
added = hvd.add_process_set([0, 1, 3])
found["added"] = float(hvd.allreduce(tf.constant(float(rank)), op=hvd.Sum,
                                     process_set=added)) if added.included() else "not in it"
found["removed"] = hvd.remove_process_set(added)
found["global"] = float(hvd.allreduce(tf.constant(float(rank)), op=hvd.Sum))
print(json.dumps(found), flush=True)
