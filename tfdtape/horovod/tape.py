"""Horovod's `DistributedGradientTape` and `PartialDistributedGradientTape`:
a gradient tape whose `gradient` all-reduces the gradients across the
processes of the job (`tfdtape.horovod.ops`, fused).

As Horovod does, the tape the user recorded with is wrapped after its
`with` block; the result is an instance of a subclass of the tape's own
class sharing its state, so only `gradient` changes.
"""

import tensorflow as tf

from tfdtape import errors
from tfdtape.horovod import collectives
from tfdtape.horovod import compression as compression_lib
from tfdtape.horovod import ops
from tfdtape.horovod import process_sets
from tfdtape.horovod import wrapping

_SETTINGS = "_tfdtape_horovod"


def DistributedGradientTape(gradtape, device_dense="", device_sparse="",
                            compression=compression_lib.Compression.none,
                            sparse_as_dense=False, op=ops.Average,
                            gradient_predivide_factor=1.0, num_groups=0, groups=None,
                            process_set=None, scale_local_gradients=True):
    """`gradtape` whose `gradient` all-reduces every gradient by `op`
    (Horovod's default: the average over the processes).

    `gradient_predivide_factor` f (Average only) divides by f before the
    sum and by size / f after it. `sparse_as_dense` densifies IndexedSlices
    first. `num_groups` and `groups` are accepted for Horovod's signature;
    how the gradients are packed is `fusion`'s (HOROVOD_FUSION_THRESHOLD).
    """
    return _wrapped(gradtape, _settings(
        "tfdtape.horovod.DistributedGradientTape", compression, sparse_as_dense, op,
        gradient_predivide_factor, process_set, scale_local_gradients, local=()))


def PartialDistributedGradientTape(gradtape, device_dense="", device_sparse="",
                                   compression=compression_lib.Compression.none,
                                   sparse_as_dense=False, op=ops.Average,
                                   gradient_predivide_factor=1.0, num_groups=0,
                                   groups=None, process_set=None, local_layers=None,
                                   scale_local_gradients=True):
    """`DistributedGradientTape` whose `local_layers`' weights (and sources
    given to `register_local_source`) are not all-reduced: their gradients
    are this process's own, divided by the size with
    `scale_local_gradients`."""
    layers = [] if local_layers is None else (
        list(local_layers) if isinstance(local_layers, (list, tuple)) else [local_layers])
    local = [weight for layer in layers for weight in layer.trainable_weights]
    return _wrapped(gradtape, _settings(
        "tfdtape.horovod.PartialDistributedGradientTape", compression, sparse_as_dense,
        op, gradient_predivide_factor, process_set, scale_local_gradients, local))


def _settings(symbol, compression, sparse_as_dense, op, predivide, process_set,
              scale_local, local):
    op = ops.resolve_op(op, None, symbol)
    ops.check_predivide(op, predivide, symbol)
    return {"compression": compression, "sparse_as_dense": sparse_as_dense, "op": op,
            "process_set": process_set,
            "predivide": predivide, "scale_local": scale_local,
            "local": {id(weight) for weight in local}}


def _wrapped(gradtape, settings):
    if not isinstance(gradtape, tf.GradientTape):
        raise TypeError(errors.message(
            "a DistributedGradientTape was asked to wrap something else",
            "tfdtape.horovod.DistributedGradientTape", "a tf.GradientTape",
            type(gradtape).__name__, "pass the tape of your `with tf.GradientTape()` block"))
    tape = wrapping.rewrapped(gradtape, {"gradient": _gradient,
                                         "register_local_source": _register_local_source,
                                         "get_local_and_global_gradients": _local_and_global})
    setattr(tape, _SETTINGS, dict(settings, local=set(settings["local"])))
    return tape


def _register_local_source(self, source):
    """Keeps `source`'s gradient this process's own (not all-reduced)."""
    getattr(self, _SETTINGS)["local"].add(id(source))


def divided(gradient, size):
    """`gradient` (a tensor or IndexedSlices) divided by `size`."""
    if size == 1:
        return gradient
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(gradient.values / tf.cast(size, gradient.values.dtype),
                                gradient.indices, gradient.dense_shape)
    return gradient / tf.cast(size, gradient.dtype)


def _local_and_global(self, target, sources, output_gradients=None,
                      use_generic_names=False):
    """Horovod's: (the (source, gradient) pairs of the local sources, those
    of the others), each in the order of `sources`, from `gradient`."""
    gradients = self.gradient(target, sources, output_gradients)
    local = getattr(self, _SETTINGS)["local"]
    pairs = list(zip(sources, gradients))
    return ([pair for pair in pairs if id(pair[0]) in local],
            [pair for pair in pairs if id(pair[0]) not in local])


def _gradient(self, target, sources, output_gradients=None, use_generic_names=False,
              **options):
    """The tape's gradient, each all-reduced across the processes of its
    process set (as computed where the set does not hold this process)."""
    settings = getattr(self, _SETTINGS)
    gradients = type(self).__mro__[1].gradient(self, target, sources, output_gradients,
                                               **options)
    symbol = "tfdtape.horovod.DistributedGradientTape"
    if not process_sets.includes(settings["process_set"], symbol):
        return gradients  # Horovod's: a set without this process leaves them local
    with collectives.within(settings["process_set"], symbol):
        return _reduced(settings, sources, gradients)


def _reduced(settings, sources, gradients):
    """`gradients` of `sources`, all-reduced among the process set in effect
    as the tape's `settings` say."""
    flat_sources = tf.nest.flatten(sources)
    flat = tf.nest.flatten(gradients)
    size = collectives.size()
    reduced = list(flat)
    shared = []
    for index, (source, gradient) in enumerate(zip(flat_sources, flat)):
        if gradient is None:
            continue
        if settings["sparse_as_dense"] and isinstance(gradient, tf.IndexedSlices):
            gradient = tf.convert_to_tensor(gradient)
            reduced[index] = gradient
        if id(source) in settings["local"]:
            if settings["scale_local"]:
                reduced[index] = divided(gradient, size)
            continue
        shared.append(index)
    ops.check_predivided_slices([reduced[index] for index in shared], settings["predivide"],
                                "tfdtape.horovod.DistributedGradientTape")
    op, prescale, postscale = ops.predivided(settings["op"], settings["predivide"])
    # Which gradients are None is part of the check every process makes
    # first: where processes disagree, the packs would pair different
    # variables' gradients.
    absent = tuple(index for index, (source, gradient) in enumerate(zip(flat_sources, flat))
                   if gradient is None and id(source) not in settings["local"])
    with tf.name_scope("DistributedGradientTape_Allreduce"):
        results = ops.reduce_group(
            [reduced[index] for index in shared], op, prescale, postscale,
            settings["compression"], kind="gradient all-reduce",
            symbol="tfdtape.horovod.DistributedGradientTape", absent=absent)
    for index, result in zip(shared, results):
        reduced[index] = result
    return tf.nest.pack_sequence_as(gradients, reduced)
