"""What every `python -m tfdtape` command shares: exit codes, one-line usage
errors, importing TensorFlow, and checking output paths up front.

Exit codes: 0 success (every check passed); 1 a check failed; 2 the command
could not run (bad arguments, unusable TensorFlow, unwritable output). This
module must not import TensorFlow at import time.
"""

import os

EXIT_PASSED, EXIT_FAILED, EXIT_UNUSABLE = 0, 1, 2

INSTALL_ADVICE = ('Install it with `pip install "tfdtape[cpu]"` (or '
                  '`pip install "tfdtape[tensorflow]"`)')


class UsageError(Exception):
    """A one-line problem with the arguments or the environment (exit 2)."""


def import_tensorflow():
    """Imports TensorFlow and checks its release; returns the module.

    Raises:
        UsageError: importing TensorFlow raised anything (a missing package,
            protobuf's TypeError, a broken install), it has no
            `__version__`, or the release is not supported.
    """
    try:
        import tensorflow  # pylint: disable=g-import-not-at-top
    except Exception as error:  # pylint: disable=broad-except
        raise UsageError(
            f"TensorFlow cannot be imported ({type(error).__name__}: "
            f"{_first_line(error)}). {INSTALL_ADVICE}") from None
    return check_release(tensorflow)


def check_tensorflow_installed():
    """Raises UsageError unless a `tensorflow` package can be found (found,
    not imported)."""
    import importlib.util  # pylint: disable=g-import-not-at-top
    try:
        found = importlib.util.find_spec("tensorflow") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise UsageError(f"TensorFlow is not installed. {INSTALL_ADVICE}")


def check_release(tensorflow):
    """Returns the imported `tensorflow` module if it is a supported release.

    Raises:
        UsageError: it has no `__version__`, or the release is not supported.
    """
    from tfdtape import versions  # pylint: disable=g-import-not-at-top
    version = getattr(tensorflow, "__version__", None)
    if not isinstance(version, str):
        raise UsageError(
            f"the tensorflow package at {getattr(tensorflow, '__file__', '?')} "
            f"has no __version__, so it is not a TensorFlow release. "
            f"{INSTALL_ADVICE}")
    try:
        supported = versions.is_supported(version)
    except ValueError:
        supported = False
    if not supported:
        raise UsageError(
            f"TensorFlow {version} is not supported: expected a release in "
            f"{versions.TENSORFLOW_REQUIREMENT}")
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
