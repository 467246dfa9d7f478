"""What every command of the command line (`python -m tfdtape`, or the
`tfdtape` console script) shares: exit codes, one-line usage errors, the
program's name, importing TensorFlow, and checking output paths up front.

Exit codes: 0 success (every check passed); 1 a check failed; 2 the command
could not run (bad arguments, unusable TensorFlow, unwritable output). This
module must not import TensorFlow at import time.
"""

import os
import sys

EXIT_PASSED, EXIT_FAILED, EXIT_UNUSABLE = 0, 1, 2

INSTALL_ADVICE = ('Install it with `pip install "tfdtape[cpu]"` (or '
                  '`pip install "tfdtape[tensorflow]"`)')


def program_name():
    """How the user started the command line: `tfdtape` (the console
    script) or `python -m tfdtape`."""
    started_as = os.path.basename(sys.argv[0]) if sys.argv else ""
    return "tfdtape" if started_as == "tfdtape" else "python -m tfdtape"


class UsageError(Exception):
    """A one-line problem with the arguments or the environment (exit 2)."""


def import_tensorflow():
    """Imports TensorFlow and checks it is a release; returns the module.

    Whether tfdtape was tested on that release is not checked here: `verify`
    and `info` report it, and `install()` applies the policy.

    Raises:
        UsageError: importing TensorFlow raised anything (a missing package,
            protobuf's TypeError, a broken install), or it has no
            `__version__`.
    """
    try:
        import tensorflow
    except Exception as error:
        raise UsageError(
            f"TensorFlow cannot be imported ({type(error).__name__}: "
            f"{_first_line(error)}). {INSTALL_ADVICE}") from None
    return check_release(tensorflow)


def import_internals(tensorflow, *names):
    """Imports the tfdtape modules `names` (which import TensorFlow's
    internals) before a command uses them.

    Raises:
        UsageError: this `tensorflow` lacks an internal they import.
    """
    import importlib

    from tfdtape import versions
    try:
        for name in names:
            importlib.import_module(f"tfdtape.{name}")
    except ImportError as error:
        raise UsageError(
            f"TensorFlow {tensorflow.__version__} lacks an internal tfdtape "
            f"uses ({type(error).__name__}: {_first_line(error)}). Install "
            f"tensorflow-cpu{versions.TENSORFLOW_REQUIREMENT}, or a tfdtape "
            "release that supports this TensorFlow") from None


def check_tensorflow_installed():
    """Raises UsageError unless a `tensorflow` package can be found (found,
    not imported)."""
    import importlib.util
    try:
        found = importlib.util.find_spec("tensorflow") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise UsageError(f"TensorFlow is not installed. {INSTALL_ADVICE}")


def check_release(tensorflow):
    """Returns the imported `tensorflow` module if it names its release.

    Raises:
        UsageError: it has no `__version__` string, so it is not a
            TensorFlow release (a stand-in module, say).
    """
    version = getattr(tensorflow, "__version__", None)
    if not isinstance(version, str):
        raise UsageError(
            f"the tensorflow package at {getattr(tensorflow, '__file__', '?')} "
            f"has no __version__, so it is not a TensorFlow release. "
            f"{INSTALL_ADVICE}")
    return tensorflow


def check_output_path(path, option):
    """Raises UsageError unless a report can be written to `path`.

    The check opens the file for appending (creating it, then removing it,
    if it did not exist), so it fails exactly where writing would.
    """
    if not path:
        raise UsageError(f"{option} needs a file path, found an empty one")
    existed = os.path.exists(path)
    if os.path.isdir(path):
        raise UsageError(f"{option} {path}: is a directory, expected a file path")
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as error:
        raise UsageError(f"{option} {path}: cannot write there "
                         f"({error.strerror or error})") from None
    if not existed:
        os.remove(path)


def _first_line(error):
    text = str(error).strip()
    return text.splitlines()[0] if text else "no message"
