"""`horovod.keras`: tfdtape.horovod.keras, re-exported."""

from tfdtape.horovod.keras import *  # noqa: F403
from tfdtape.horovod.keras import callbacks  # noqa: F401
from tfdtape.horovod.keras import elastic  # noqa: F401
