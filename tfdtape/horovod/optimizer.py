"""`horovod.tensorflow.DistributedOptimizer`: TensorFlow 2 programs wrap
their Keras optimizer with it, as with the Keras module's (one engine,
`tfdtape.horovod.keras.optimizer`); TensorFlow 1's optimizers, which run in
a Session, are refused."""

import tensorflow as tf

from tfdtape import errors
from tfdtape.horovod import compression as compression_lib
from tfdtape.horovod.collectives import Average


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="",
                         device_sparse="", compression=compression_lib.Compression.none,
                         sparse_as_dense=False, backward_passes_per_step=1, op=Average,
                         gradient_predivide_factor=1.0, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=None,
                         scale_local_gradients=True):
    """Horovod's: `optimizer` (a Keras 3 or tf_keras optimizer) all-reducing
    the gradients across the processes before applying them, exactly as
    `tfdtape.horovod.keras.DistributedOptimizer` with the same arguments.

    Raises:
        NotImplementedError: a TensorFlow 1 optimizer (tf.compat.v1.train).
        ValueError: as the Keras module's DistributedOptimizer.
    """
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise NotImplementedError(errors.message(
            "a TensorFlow 1 optimizer was to be distributed",
            "tfdtape.horovod.DistributedOptimizer", "a Keras optimizer (TensorFlow 2)",
            type(optimizer).__name__ + " (tf.compat.v1.train), whose Session runs on this "
            "process alone", "use a keras.optimizers optimizer, or "
            "hvd.DistributedGradientTape in a custom loop"))
    from tfdtape.horovod.keras import optimizer as keras_optimizer  # it imports this package
    return keras_optimizer.DistributedOptimizer(
        optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, num_groups=num_groups,
        groups=groups, process_set=process_set, scale_local_gradients=scale_local_gradients)
