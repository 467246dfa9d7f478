"""tfdtape: gradient tapes that watch distributed variables, on installed TensorFlow.

`import tfdtape` patches TensorFlow so that `tf.GradientTape` watches
`tf.distribute` variables as TensorFlow commit 37ef0e00 ("Make defun work
under distributed strategies") specifies: the container (such as the
`MirroredVariable`) in replica context, every local component in
cross-replica context. It also makes `GradientTape.watch` and
`GradientTape.gradient` work on distributed variables in cross-replica
context. Set TFDTAPE_AUTOINSTALL=0 before the import to install by hand.

The command line (`python -m tfdtape`, or the `tfdtape` console script) does
not install on import: its commands manage the patch themselves, and report a
missing TensorFlow in one line instead of a traceback.

PYTEST_DONT_REWRITE: under `python -m tfdtape run -m pytest` tfdtape is
imported before pytest starts, and this marker tells pytest's assertion
rewriting to leave it alone rather than warn that it was imported already.
"""

import importlib
import importlib.util
import os
import sys

from tfdtape import switches
from tfdtape.errors import NotWatchableError
from tfdtape.errors import PatchConflictError
from tfdtape.errors import PatchInUseError
from tfdtape.errors import UnsupportedTensorFlowError
from tfdtape.versions import RELEASE as __version__  # noqa: F401 (the public version)

# Public names that need TensorFlow, imported on first use.
_TENSORFLOW_NAMES = {
    "install": "tfdtape.patching",
    "uninstall": "tfdtape.patching",
    "is_installed": "tfdtape.patching",
    "patched": "tfdtape.patching",
    "resolve": "tfdtape.resolution",
    "trace": "tfdtape.traces",
    "explain": "tfdtape.explaining",
}

# _TENSORFLOW_NAMES's keys are strings, which ruff cannot tell (PLE0604).
__all__ = ["NotWatchableError", "PatchConflictError", "PatchInUseError",  # noqa: PLE0604
           "UnsupportedTensorFlowError", *_TENSORFLOW_NAMES]


def __getattr__(name):
    if name in _TENSORFLOW_NAMES:
        _check_required_modules()
        return getattr(importlib.import_module(_TENSORFLOW_NAMES[name]), name)
    raise AttributeError(f"module 'tfdtape' has no attribute {name!r}")


def _autoinstall_requested():
    """Reads TFDTAPE_AUTOINSTALL (default on); raises ValueError if unreadable."""
    return switches.read(switches.AUTOINSTALL, True,
                         "Set it to 0 to import tfdtape without installing "
                         "the patch")


def _imported_by_command_line():
    """True while the command line is starting: `python -m tfdtape` (or
    `-mtfdtape`, or `-m tfdtape.__main__`), or the `tfdtape` console script."""
    if sys.argv[:1] != ["-m"]:
        return _started_as_console_script()
    names = ("tfdtape", "tfdtape.__main__")
    arguments = iter(getattr(sys, "orig_argv", [])[1:])
    for argument in arguments:
        if argument == "-m":
            return next(arguments, None) in names
        if argument.startswith("-m"):
            return argument[2:] in names
    return False


def _started_as_console_script():
    """True while the `tfdtape` console script that pip writes (a `__main__`
    called tfdtape that imports tfdtape.__main__) imports this package."""
    script = sys.argv[0] if sys.argv else ""
    if os.path.basename(script) != "tfdtape":
        return False
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if main_file != script:
        return False
    try:
        with open(script, "rb") as opened:
            return b"from tfdtape.__main__ import main" in opened.read(4096)
    except OSError:
        return False


_REQUIRED_MODULES = (("absl", "absl-py"),
                     ("tensorflow", "tensorflow-cpu or tensorflow"))


def _check_required_modules():
    """Raises ModuleNotFoundError naming a missing dependency of the patch,
    and the command that installs it."""
    for module, distribution in _REQUIRED_MODULES:
        if importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(
                f"tfdtape: the module {module!r} "
                f"({distribution}) is not installed. Install tfdtape with "
                'TensorFlow: pip install "tfdtape[cpu]" (or '
                'pip install "tfdtape[tensorflow]"); set '
                f"{switches.AUTOINSTALL}=0 to import tfdtape without it",
                name=module)


if not _imported_by_command_line() and _autoinstall_requested():
    _check_required_modules()
    importlib.import_module("tfdtape.patching").install()
