"""`horovod.tensorflow.util`: the one member Horovod's test files import."""

from tfdtape.horovod import _executing_eagerly  # noqa: F401
