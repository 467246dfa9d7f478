"""One process of a generated Horovod job (tests/generated_horovod.py):
`python generated_horovod_process.py SEED COUNT` under `tfdtape launch`
runs every case in order (a case that put the job out of step shows in the
next) and prints one JSON list: per case, the result's shapes, dtypes and
values, an error's type and message, or that this process was outside the
case's process set."""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf

import generated_horovod as gh
import tfdtape.horovod as hvd


def call(case, tensors, sets):
    """The case's collective on `tensors`, as Horovod's API takes it."""
    options = {}
    if case.members:
        options["process_set"] = sets[case.members]
    compression = hvd.Compression.fp16 if case.compression == "fp16" else hvd.Compression.none
    op = getattr(hvd, case.op)
    scales = {"prescale_factor": case.prescale, "postscale_factor": case.postscale}
    kind = case.kind
    if kind == "allreduce":
        return [hvd.allreduce(tensors[0], op=op, compression=compression, **scales, **options)]
    if kind == "grouped_allreduce":
        return hvd.grouped_allreduce(tensors, op=op, compression=compression, **scales,
                                     **options)
    if kind == "allgather":
        return [hvd.allgather(tensors[0], **options)]
    if kind == "grouped_allgather":
        return hvd.grouped_allgather(tensors, **options)
    if kind == "broadcast":
        root = (case.members or range(hvd.size()))[case.root]
        return [hvd.broadcast(tensors[0], root_rank=root, **options)]
    if kind == "alltoall":
        splits = list(case.splits[hvd.rank()]) if case.splits else None
        received = hvd.alltoall(tensors[0], splits=splits, **options)
        return [received[0] if splits is not None else received]
    if kind == "reducescatter":
        return [hvd.reducescatter(tensors[0], op=op, compression=compression, **scales,
                                  **options)]
    return hvd.grouped_reducescatter(tensors, op=op, compression=compression, **scales,
                                     **options)


def trained(seed, case, sets):
    """A TRAINING case (tests/generated_horovod.py): (the results, whether
    the tape's table gradient is IndexedSlices)."""
    options = {"op": getattr(hvd, case.op), "sparse_as_dense": case.sparse_as_dense,
               "gradient_predivide_factor": case.predivide,
               "compression": hvd.Compression.fp16 if case.compression == "fp16"
               else hvd.Compression.none}
    if case.members:
        options["process_set"] = sets[case.members]
    weight, table = (tf.Variable(value) for value in gh.initial_variables(seed, case))

    def gradients(x, c, ids, d):
        with tf.GradientTape() as tape:
            loss = (tf.reduce_sum(tf.matmul(x, weight) * c)
                    + tf.reduce_sum(tf.gather(table, ids) * d))
        if case.kind == "tape":
            tape = hvd.DistributedGradientTape(tape, **options)
        return tape.gradient(loss, [weight, table])

    batches = [[tf.constant(value) for value in gh.batch(seed, case, hvd.rank(), step)]
               for step in range(case.steps)]
    if case.kind == "tape":
        found = (tf.function(gradients) if case.traced else gradients)(*batches[0])
        return ([found[0], tf.convert_to_tensor(found[1])],
                isinstance(found[1], tf.IndexedSlices))
    optimizer = hvd.DistributedOptimizer(
        tf.keras.optimizers.SGD(gh.LEARNING_RATE), backward_passes_per_step=case.passes,
        average_aggregated_gradients=case.average_passes, **options)

    def step(*given):
        optimizer.apply_gradients(zip(gradients(*given), [weight, table]))

    step = tf.function(step) if case.traced else step
    for given in batches:
        step(*given)
    return [tf.convert_to_tensor(weight), tf.convert_to_tensor(table)], None


def tensor_of(value, dtype):
    """`value` as a tensor of `dtype` (bfloat16 through float32, exact for
    the oracle's small integers: TensorFlow 2.12 takes no NumPy bfloat16)."""
    if dtype == "bfloat16":
        return tf.cast(tf.constant(value.astype(np.float32)), tf.bfloat16)
    return tf.constant(value)


def described(tensor):
    value = tensor.numpy()
    return {"shape": list(value.shape), "dtype": tensor.dtype.name,
            "values": np.asarray(value, np.float64).ravel().tolist()}


def main():
    seed, count = int(sys.argv[1]), int(sys.argv[2])
    hvd.init()
    cases = gh.draw(seed, count, hvd.size())
    sets = {}
    for case in cases:  # every process adds the same sets in the same order
        if case.members and case.members not in sets:
            sets[case.members] = hvd.add_process_set(list(case.members))
    found = []
    for case in cases:
        if case.members and hvd.rank() not in case.members:
            found.append({"absent": True})
            continue
        if case.kind in gh.TRAINING:
            try:
                results, sparse = trained(seed, case, sets)
                found.append({"results": [described(result) for result in results],
                              "sparse": sparse})
            except Exception as error:
                found.append({"error": type(error).__name__, "message": str(error)[:3000]})
            continue
        tensors = [tensor_of(value, case.dtype) for value in gh.inputs(seed, case, hvd.rank())]

        wanted = gh.expected(seed, case, hvd.size(), hvd.rank())
        differentiated = case.gradient and wanted[0] == "value"
        shapes = [value.shape for value in wanted[1]] if differentiated else []

        def run(*given, case=case, shapes=shapes, differentiated=differentiated):
            """The results and, for a case with a gradient, the gradient of
            sum(result * coefficients) for the inputs (the coefficients of
            the shape the result must have: traced, it may be unknown)."""
            with tf.GradientTape() as tape:
                tape.watch(given)
                results = call(case, list(given), sets)
                loss = tf.add_n([tf.reduce_sum(result * gh.coefficients(
                    seed, case, shape)) for result, shape in zip(
                        results, shapes)]) if differentiated else None
            return results, tape.gradient(loss, list(given)) if differentiated else []

        try:
            results, gradients = (tf.function(run) if case.traced else run)(*tensors)
            found.append({"results": [described(result) for result in results],
                          "gradients": [described(gradient) for gradient in gradients]})
        except Exception as error:
            found.append({"error": type(error).__name__, "message": str(error)[:3000]})
    print(json.dumps(found))


if __name__ == "__main__":
    main()
