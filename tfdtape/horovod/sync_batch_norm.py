"""Horovod's `SyncBatchNormalization`: a BatchNormalization of the Keras
`tf.keras` is (Keras 3, or Keras 2 / tf_keras) whose training statistics
are the job's: the mean and variance over every process's batch, as one
device's BatchNormalization computes them on the global batch.

Two all-reduces per layer and training step (the check of each riding in
it): the sums and counts (the global mean), then the squared deviations
from it (the variance), so
batches of different sizes per process weigh by their rows and no
E[x²] - E[x]² cancels. Gradients flow through both, as through Horovod's.
"""

import tensorflow as tf

from tfdtape import errors
from tfdtape.horovod import ops

_SYMBOL = "tfdtape.horovod.SyncBatchNormalization"
SERIALIZED_PACKAGE = "tfdtape.horovod"
"""The package Keras's registry files the layer under: a model saved with
it (`model.save`, ModelCheckpoint) loads with `tf.keras.models.load_model`
and `hvd.load_model` while tfdtape.horovod is imported, no custom_objects
needed."""


def synced_moments(inputs, axes, weights=None):
    """(mean, variance) over `axes` of every process's `inputs` (with
    `weights`, each element's frequency), kept dims, in float32 for 16-bit
    floats and cast back."""
    values = tf.cast(inputs, tf.float32) if inputs.dtype in (tf.float16, tf.bfloat16) \
        else inputs
    weights = tf.ones_like(values) if weights is None else tf.broadcast_to(
        tf.cast(weights, values.dtype), tf.shape(values))
    local = [tf.reduce_sum(values * weights, axes, keepdims=True),
             tf.reduce_sum(weights, axes, keepdims=True)]
    total, count = ops.grouped_allreduce(local, op=ops.Sum)
    mean = total / count
    squared = tf.reduce_sum(tf.square(values - mean) * weights, axes, keepdims=True)
    variance = ops.grouped_allreduce([squared], op=ops.Sum)[0] / count
    return tf.cast(mean, inputs.dtype), tf.cast(variance, inputs.dtype)


def _checked(fused, kwargs):
    """Horovod's constructor arguments, as the Keras BatchNormalization
    takes them.

    Raises:
        ValueError: fused=True or None (Horovod's refusal), or
            synchronized=True (Keras's own synchronization over a strategy).
    """
    if fused in (True, None):
        raise ValueError(errors.message(
            "SyncBatchNormalization was asked for a fused kernel", _SYMBOL, "fused=False",
            f"fused={fused}", "drop fused (its statistics are all-reduced, which the "
            "fused kernel cannot do)"))
    if kwargs.get("synchronized"):
        raise ValueError(errors.message(
            "SyncBatchNormalization was also given synchronized=True", _SYMBOL,
            "statistics over the job's processes, or a strategy's replicas",
            "synchronized=True", "drop synchronized: this layer synchronizes over the "
            "processes of the tfdtape.horovod job"))
    return kwargs  # Keras names it from the class: sync_batch_normalization, _1, ...


def _weights(mask, dtype):
    """Each element's frequency from Keras's `mask` (one less dimension than
    the inputs), or None without one."""
    return None if mask is None else tf.expand_dims(tf.cast(mask, dtype), -1)


def _keras3_class(base):
    class SyncBatchNormalization(base):
        """Horovod's SyncBatchNormalization (Keras 3): see the module."""

        def __init__(self, fused=False, **kwargs):
            super().__init__(**_checked(fused, kwargs))

        def _moments(self, inputs, mask):
            mean, variance = synced_moments(inputs, self._reduction_axes,
                                            _weights(mask, inputs.dtype))
            return tf.squeeze(mean), tf.squeeze(variance)

    return SyncBatchNormalization


def _keras2_class(base):
    class SyncBatchNormalization(base):
        """Horovod's SyncBatchNormalization (Keras 2, tf_keras): see the module."""

        def __init__(self, fused=False, **kwargs):
            super().__init__(fused=False, **_checked(fused, kwargs))

        def _calculate_mean_and_var(self, inputs, reduction_axes, keep_dims, mask=None):
            mean, variance = synced_moments(inputs, reduction_axes,
                                            _weights(mask, inputs.dtype))
            if not keep_dims:
                mean, variance = (tf.squeeze(mean, reduction_axes),
                                  tf.squeeze(variance, reduction_axes))
            return mean, variance

    return SyncBatchNormalization


def _made():
    """The class for the Keras of `tf.keras`, in Keras's registry of
    serializable objects; where the registry holds it already (this module
    reloaded), that class, so that what is saved loads as what was built."""
    registered = tf.keras.utils.get_registered_object(
        f"{SERIALIZED_PACKAGE}>SyncBatchNormalization")
    if registered is not None:
        return registered
    base = tf.keras.layers.BatchNormalization
    made = _keras2_class(base) if hasattr(base, "_calculate_mean_and_var") \
        else _keras3_class(base)
    made.__module__ = __name__
    made.__qualname__ = made.__name__
    return tf.keras.utils.register_keras_serializable(package=SERIALIZED_PACKAGE)(made)


SyncBatchNormalization = _made()
