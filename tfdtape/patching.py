"""Installing and uninstalling tfdtape's patch: atomic, idempotent, reversible.

All state lives here, behind one lock, so several threads (MirroredStrategy
runs replica functions in threads) can call these at once. `install()` checks
every target before it replaces any, and puts back what it replaced if a
replacement fails; `uninstall()` restores TensorFlow's exact original
function objects, and refuses if anything else has replaced one of them since.
"""

import contextlib
import threading

from absl import logging

from tfdtape import errors
from tfdtape import targets
from tfdtape import versions

_lock = threading.RLock()
_applied = None  # While installed: [(target, original, replacement), ...].


def is_installed():
    """True while tfdtape's patch is installed."""
    return _applied is not None


def install():
    """Installs the patch into TensorFlow; returns True if this call did it.

    Raises:
        UnsupportedTensorFlowError: this TensorFlow is outside the supported
            range, or an internal tfdtape patches or calls is missing or has
            an unexpected shape. Nothing is patched then.
    """
    global _applied
    with _lock:
        if _applied is not None:
            return False
        plan = _plan()
        done = []
        try:
            for target, original, replacement in plan:
                setattr(target.owner, target.attribute, replacement)
                done.append((target, original))
        except BaseException:
            for target, original in reversed(done):
                setattr(target.owner, target.attribute, original)
            raise
        _applied = plan
        logging.info("tfdtape: installed into TensorFlow %s, replacing %s",
                     errors.tensorflow_version(),
                     ", ".join(target.symbol for target, _, _ in plan))
        return True


def uninstall():
    """Restores TensorFlow's original functions; returns True if this call did it.

    Raises:
        PatchConflictError: something else replaced a function tfdtape
            patched. Nothing is restored then.
    """
    global _applied
    with _lock:
        if _applied is None:
            return False
        foreign = [target.symbol for target, _, replacement in _applied
                   if target.current() is not replacement]
        if foreign:
            raise errors.PatchConflictError(errors.message(
                "cannot uninstall: another patch replaced tfdtape's",
                ", ".join(foreign), "tfdtape's replacement",
                "a different object",
                "Remove the other patch first (restore tfdtape's function), "
                "then call tfdtape.uninstall() again"))
        for target, original, _ in reversed(_applied):
            setattr(target.owner, target.attribute, original)
        _applied = None
        return True


@contextlib.contextmanager
def patched():
    """Installs tfdtape inside the block; restores the previous state after."""
    installed_here = install()
    try:
        yield
    finally:
        if installed_here:
            uninstall()


def preflight():
    """Checks what install() would check; returns the targets it would patch.

    Raises:
        UnsupportedTensorFlowError: as install() would.
    """
    return [target for target, _, _ in _plan()]


def _plan():
    """Checks everything, then returns [(target, original, replacement)]."""
    version = errors.tensorflow_version()
    if not versions.is_supported(version):
        raise errors.UnsupportedTensorFlowError(errors.message(
            "unsupported TensorFlow release", "tensorflow.__version__",
            f"a release in {versions.TENSORFLOW_REQUIREMENT}", version,
            f"Install tensorflow-cpu{versions.TENSORFLOW_REQUIREMENT} (or "
            "tensorflow), or a tfdtape release that supports this one"))
    targets.check_required_symbols()
    plan = []
    for target in targets.patch_targets():
        original = target.check()
        if original is not None:
            plan.append((target, original, target.make_replacement(original)))
    return plan
