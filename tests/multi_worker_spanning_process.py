"""One worker of a MultiWorkerMirroredStrategy cluster (TF_CONFIG set):
trains each case of `worker_training` for its steps, in order, and prints
one JSON line: the task and, per case, the weights (as floats and as the
hex of their float32 bytes, for bitwise comparison between workers) and
whether each gradient came back None, or the error the case raised.

    python multi_worker_spanning_process.py CASES_JSON [--stock] [--no-rows]

--stock runs without tfdtape (TFDTAPE_AUTOINSTALL=0 is set by the caller):
the control. Run by tests/test_multi_worker_spanning.py, one fresh process
per worker, all workers with the same cases (the collectives of every
worker must match, in order).
"""

import contextlib
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf

import worker_training as wt

STOCK = "--stock" in sys.argv
NO_ROWS = "--no-rows" in sys.argv
"""Also report `transfers_of_no_rows` (with tfdtape only: stock TensorFlow
2.21 ends the process there)."""
if not STOCK:
    import tfdtape  # noqa: F401 (installs tfdtape)


def replica_batches(strategy, task, case):
    """Each replica's rows of the global batch, by its global replica id
    (this worker's replicas follow those of the workers before it)."""
    local = len(strategy.extended.worker_devices)
    per = wt.GLOBAL_BATCH // strategy.num_replicas_in_sync

    def rows(context, data):
        replica = task * local + context.replica_id_in_sync_group % local
        return data[replica * per:(replica + 1) * per]

    return (strategy.experimental_distribute_values_from_function(
                lambda context: rows(context, wt.inputs(case))),
            strategy.experimental_distribute_values_from_function(
                lambda context: rows(context, wt.LABELS)))


def run_case(strategy, task, case):
    with strategy.scope():
        model, variables, optimizer = wt.build(case)
    features, labels = replica_batches(strategy, task, case)
    nones = []

    def share(x, y):
        error = model(x) - y
        per_example = tf.reduce_sum(error * error, axis=1)
        if case["target"] == "mean":
            return tf.reduce_mean(per_example)
        if case["target"] == "sum_axis":
            return per_example / wt.GLOBAL_BATCH
        if case["target"] == "mean_axis":
            return per_example
        return tf.nn.compute_average_loss(per_example, global_batch_size=wt.GLOBAL_BATCH)

    def reduced(per_replica):
        target = case["target"]
        if target in ("sum_axis", "mean_axis"):
            return strategy.reduce(target.split("_")[0].upper(), per_replica, axis=0)
        return strategy.reduce(target.upper(), per_replica, axis=None)

    def spanning():
        outer = tf.GradientTape() if case.get("nested") else contextlib.nullcontext()
        with outer:  # A second tape records the gradient (second order).
            with tf.GradientTape() as tape:
                per_replica = strategy.run(share, args=(features, labels))
                local = tf.reduce_sum(tf.add_n(strategy.experimental_local_results(
                    per_replica)))
                loss = local if case["target"] == "local_sum" else reduced(per_replica)
                if case.get("l2") == "varying":
                    loss += tf.stop_gradient(local) * wt.l2_term(model)
                elif case.get("l2"):
                    loss += wt.l2_term(model)
                if case.get("partly") and task == 0:  # This worker alone (eagerly).
                    spare = variables[-2]
                    loss += tf.reduce_sum(tf.square(spare) if case["partly"] == "outside"
                                          else strategy.run(
                                              lambda: tf.reduce_sum(spare)))
            unconnected = (tf.UnconnectedGradients.ZERO if case.get("zeros")
                           else tf.UnconnectedGradients.NONE)
            gradients = wt.transformed(case, tape.gradient(
                loss, variables, unconnected_gradients=unconnected), local)
        nones.append([g is None for g in gradients])
        if case.get("apply") == "inside":  # The total applied per replica.
            strategy.run(lambda: optimizer.apply_gradients(zip(gradients, variables)))
        else:
            optimizer.apply_gradients(zip(gradients, variables), **wt.apply_options(case))

    def tutorial():
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                loss = share(x, y)
            gradients = tape.gradient(loss, variables)
            optimizer.apply_gradients(zip(gradients, variables), **wt.apply_options(case))
        strategy.run(replica_step, args=(features, labels))

    step = spanning if case["loop"] == "spanning" else tutorial
    if case["mode"] == "tf_function":
        step = tf.function(step)
    try:
        for _ in range(wt.STEPS):
            if case["scope"]:
                with strategy.scope():
                    step()
            else:
                step()
    except Exception as error:
        text = str(error)
        return {"error": type(error).__name__,
                "message": next((line.strip() for line in text.splitlines()
                                 if "tfdtape: " in line), " ".join(text.split()))}
    weights = [np.asarray(v.numpy(), np.float32) for v in variables]
    return {"weights": [w.tolist() for w in weights],
            "bytes": [w.tobytes().hex() for w in weights],
            "none_gradients": nones[-1] if nones else None}


def transfers_of_no_rows(strategy, task):
    """What the job's collectives give for tensors of no elements made from
    NumPy (a new variable's initial value too, and the variable made after
    it), and for worker 0's batch of no rows beside worker 1's two
    (tfdtape.empty_collectives; stock TensorFlow 2.21 ends the process):
    each result's shape and values, and where the variable's component is."""
    def empty():
        return tf.constant(np.empty((0, 3), np.float32))

    def rows():
        return tf.constant(np.full((2 * task, 3), float(task + 1), np.float32))

    def all_reduced():
        return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
            "SUM", empty()))

    with strategy.scope():  # the chief's initial values, broadcast
        created = tf.Variable(np.zeros((0, 3), np.float32))
        following = tf.Variable(np.full([2], float(task + 1), np.float32))
    found = {
        "variable": strategy.experimental_local_results(created)[0],
        "variable_after": strategy.experimental_local_results(following)[0],
        "reduce": strategy.reduce("SUM", strategy.run(empty), axis=None),
        "all_reduce": strategy.experimental_local_results(all_reduced())[0],
        "gather": strategy.gather(strategy.run(empty), axis=0),
        "gather_traced": tf.function(
            lambda: strategy.gather(strategy.run(empty), axis=0))(),
        "gather_uneven": strategy.gather(strategy.run(rows), axis=0),
    }
    report = {name: [list(value.shape), value.numpy().tolist()]
              for name, value in found.items()}
    report["variable_device"] = strategy.experimental_local_results(created)[0].device
    return report


def main():
    cases = json.loads(sys.argv[1])
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    results = [run_case(strategy, task, case) for case in cases]
    print(json.dumps({"task": task, "workers": strategy.extended._num_workers,
                      "replicas": strategy.num_replicas_in_sync,
                      "results": results,
                      "no_rows": transfers_of_no_rows(strategy, task) if NO_ROWS else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
