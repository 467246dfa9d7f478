"""Horovod's Keras API (`horovod.tensorflow.keras`, `horovod.keras`) for
Keras 3 and tf_keras: `DistributedOptimizer` (`optimizer`), the callbacks
(`callbacks`), `PartialDistributedOptimizer`, `load_model`, `elastic`
(Horovod's elastic Keras API), and
the collectives with the Keras module's signatures (`allreduce(value,
name, average, ...)`), with the basics of `tfdtape.horovod` under the same
names.
"""

import importlib

import tensorflow as tf

from tfdtape.horovod import *  # noqa: F403 (Horovod's keras module re-exports them)
from tfdtape.horovod import compression as compression_lib
from tfdtape.horovod import exchange
from tfdtape.horovod import ops
from tfdtape.horovod.keras import callbacks  # noqa: F401 (hvd.callbacks.X, as Horovod)
from tfdtape.horovod.keras.optimizer import DistributedOptimizer
from tfdtape.horovod.keras.optimizer import PartialDistributedOptimizer  # noqa: F401

# hvd.elastic is Keras's here, as in Horovod (the star import bound the other)
elastic = importlib.import_module("tfdtape.horovod.keras.elastic")


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0,
              op=None, compression=compression_lib.Compression.none):
    """Horovod's Keras `allreduce`: `value` (a number, array or tensor)
    reduced over the processes by `op` (the average by default)."""
    return ops.allreduce(tf.convert_to_tensor(value), average=average, op=op,
                         prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                         compression=compression, name=name)


def allgather(value, name=None):
    """Horovod's Keras `allgather`: every process's `value` concatenated
    along the first dimension, in rank order."""
    return ops.allgather(tf.convert_to_tensor(value), name=name)


def broadcast(value, root_rank, name=None):
    """Horovod's Keras `broadcast`: `root_rank`'s `value` on every process."""
    return ops.broadcast(tf.convert_to_tensor(value), root_rank, name=name)


def reducescatter(value, name=None, op=ops.Average):
    """Horovod's Keras `reducescatter`: `value` reduced over the processes
    by `op` (Average or Sum), this process's rows of it."""
    return exchange.reducescatter(tf.convert_to_tensor(value), op=op, name=name)


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=compression_lib.Compression.none):
    """The Keras model saved at `filepath`, its optimizer (restored with its
    state) wrapped in a `DistributedOptimizer` with `compression`, as
    Horovod's `load_model` gives it. `custom_optimizers`, optimizer classes
    the file names, are passed to Keras with `custom_objects`."""
    objects = dict(custom_objects or {})
    for optimizer_class in custom_optimizers or ():
        objects[optimizer_class.__name__] = optimizer_class
    model = tf.keras.models.load_model(filepath, custom_objects=objects or None)
    if getattr(model, "optimizer", None) is not None:
        model.optimizer = DistributedOptimizer(model.optimizer, compression=compression)
    return model
