"""tfdtape: gradient tapes that watch distributed variables, on installed TensorFlow.

`import tfdtape` patches TensorFlow so that `tf.GradientTape` watches
`tf.distribute` variables as TensorFlow commit 37ef0e00 ("Make defun work
under distributed strategies") specifies: the container (such as the
`MirroredVariable`) in replica context, every local component in
cross-replica context. It also makes `GradientTape.watch` and
`GradientTape.gradient` work on distributed variables in cross-replica
context. Set TFDTAPE_AUTOINSTALL=0 before the import to install by hand.
"""

import os

from tfdtape.errors import NotWatchableError
from tfdtape.errors import PatchConflictError
from tfdtape.errors import UnsupportedTensorFlowError
from tfdtape.patching import install
from tfdtape.patching import is_installed
from tfdtape.patching import patched
from tfdtape.patching import uninstall
from tfdtape.resolution import resolve
from tfdtape.versions import RELEASE as __version__

__all__ = [
    "NotWatchableError", "PatchConflictError", "UnsupportedTensorFlowError",
    "install", "is_installed", "patched", "resolve", "uninstall",
]

_AUTOINSTALL_VARIABLE = "TFDTAPE_AUTOINSTALL"
_AUTOINSTALL_VALUES = {"1": True, "true": True, "yes": True, "on": True,
                       "0": False, "false": False, "no": False, "off": False}


def _autoinstall_requested():
    """Reads TFDTAPE_AUTOINSTALL (default on); raises ValueError if unreadable."""
    raw = os.environ.get(_AUTOINSTALL_VARIABLE, "1")
    choice = _AUTOINSTALL_VALUES.get(raw.strip().lower())
    if choice is None:
        raise ValueError(
            f"tfdtape: {_AUTOINSTALL_VARIABLE}={raw!r} is not understood: "
            f"expected one of {', '.join(sorted(_AUTOINSTALL_VALUES))}. Set it "
            "to 0 to import tfdtape without installing the patch")
    return choice


if _autoinstall_requested():
    install()
