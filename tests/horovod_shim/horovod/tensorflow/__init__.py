"""`horovod.tensorflow`: tfdtape.horovod, re-exported."""

from tfdtape.horovod import *  # noqa: F403
from tfdtape.horovod import _executing_eagerly  # noqa: F401 (Horovod's tests call it)
