"""tfdtape's exceptions and the one shape all its messages take.

Every message reads
``tfdtape: <what failed> (<TensorFlow symbol>): expected <X>, found <Y> in
TensorFlow <version>. <what to do>.``
so a user can tell at a glance what broke, where, on which TensorFlow, and
what to try next. This module must not import TensorFlow.
"""

import sys


class UnsupportedTensorFlowError(RuntimeError):
    """An internal that tfdtape patches is missing or has an unexpected shape.

    Raised by `tfdtape.install()` before anything is patched.
    """


class PatchConflictError(RuntimeError):
    """Another library's patch holds a function tfdtape patches.

    Raised by `tfdtape.install()` when the other patch was there first, and
    by `tfdtape.uninstall()` when it came after (it wraps or replaced
    tfdtape's function), instead of dropping that patch; nothing is patched
    or restored when it is raised.
    """


class PatchInUseError(RuntimeError):
    """`tfdtape.uninstall()` was called while `tfdtape.patched()` blocks are open.

    Nothing is restored; the last block to close restores the state from
    before the first one opened.
    """


class NotWatchableError(TypeError, ValueError):
    """A gradient tape was asked to watch something that is not watchable.

    A TypeError, and also a ValueError because TensorFlow's own
    `GradientTape.watch` raises ValueError for such input.
    """

    # Exception's own constructor (a message and nothing else): AutoGraph
    # rebuilds an error raised inside a tf.function only when its type has
    # it, and would turn this one into a StagingError, no ValueError.
    __init__ = Exception.__init__


def tensorflow_version():
    """The running TensorFlow's version string, or 'unknown' before import."""
    tf_module = sys.modules.get("tensorflow")
    version = getattr(tf_module, "__version__", None)
    if version is None:
        version_module = sys.modules.get("tensorflow.python.framework.versions")
        version = getattr(version_module, "__version__", "unknown")
    return version


def message(failed, symbol, expected, found, remedy):
    """Formats one tfdtape error message in the shape the module doc gives."""
    return (f"tfdtape: {failed} ({symbol}): expected {expected}, found {found} "
            f"in TensorFlow {tensorflow_version()}. {remedy.rstrip('.')}.")


def is_tfdtape_error(error):
    """True for an exception whose message tfdtape wrote (`message`)."""
    return str(error).startswith("tfdtape: ")


def add_note(error, note):
    """Adds `note` to `error` once (exception notes, PEP 678; Python < 3.11
    keeps them in __notes__ without printing them)."""
    notes = getattr(error, "__notes__", [])
    if note in notes:
        return
    if hasattr(error, "add_note"):
        error.add_note(note)
    else:
        error.__notes__ = [*notes, note]


def extend_message(error, text):
    """Appends `text` to `error`'s message on a line of its own, where the
    message is its one string argument (so that AutoGraph, which re-raises
    from the message, keeps it); adds it as a note otherwise."""
    args = error.args
    if (type(error).__str__ is BaseException.__str__ and len(args) == 1 and
            isinstance(args[0], str)):
        if text not in args[0]:
            error.args = (f"{args[0]}\n{text}",)
    else:
        add_note(error, text)
