"""Installing and uninstalling tfdtape's patch: atomic, idempotent, reversible.

Whether tfdtape is installed is read from TensorFlow itself: it is installed
while a patch target holds one of tfdtape's replacements, and each replacement
carries the function it replaced (`targets.original_of`). So a reload of any
tfdtape module, which resets module globals, can neither lose TensorFlow's
originals nor make `install()` take tfdtape's own functions for them.

The rest of the state (one lock, and the open `patched()` blocks) is kept
across `importlib.reload` and made safe in a forked child
(`tfdtape.process_state`): the threads that held the lock or opened blocks
do not exist there.
"""

import contextlib
import logging
import threading
import types

from tfdtape import errors
from tfdtape import events
from tfdtape import frame_filters
from tfdtape import late_imports
from tfdtape import process_state
from tfdtape import release_policy
from tfdtape import targets


def _new_state():
    """The lock, the open patched() blocks ({block: thread id}), whether
    tfdtape was installed when the first of them opened, and whether
    installing into an untested TensorFlow was logged already."""
    return types.SimpleNamespace(lock=process_state.lock(reentrant=True), blocks={},
                                 installed_before_blocks=False,
                                 untested_logged=False)


_state = process_state.kept(globals(), "_state", _new_state)


def is_installed():
    """True while TensorFlow holds tfdtape's replacements."""
    return any(target.holder() == targets.TFDTAPE
               for target in targets.patch_targets())


def install():
    """Installs the patch into TensorFlow; returns True if this call did it.

    A target already holding tfdtape's replacement is kept as it is. Inside
    open `patched()` blocks tfdtape is installed, so this returns False.

    On a TensorFlow outside the tested range it installs only when
    `tfdtape.release_policy` accepts it (TFDTAPE_ALLOW_UNTESTED_TENSORFLOW=1),
    and then logs one WARNING per process.

    Raises:
        UnsupportedTensorFlowError: this TensorFlow is untested and not
            accepted, or an internal tfdtape patches or calls is missing or
            has an unexpected shape. Nothing is patched then.
        ValueError: TFDTAPE_ALLOW_UNTESTED_TENSORFLOW holds a word not
            understood. Nothing is patched then.
        PatchConflictError: tfdtape is not installed and another library's
            patch holds a function tfdtape replaces. Nothing is patched then.
    """
    with _state.lock:
        return _install_locked()


def uninstall():
    """Restores TensorFlow's original functions; returns True if this call did it.

    Raises:
        PatchInUseError: `patched()` blocks are open (the last one to close
            restores the state from before the first). Nothing is restored.
        PatchConflictError: something else holds a function tfdtape
            patched, such as a wrapper around tfdtape's. Nothing is restored.
    """
    with _state.lock:
        if _state.blocks:
            raise errors.PatchInUseError(errors.message(
                "cannot uninstall while tfdtape.patched() blocks are open",
                "tfdtape.uninstall", "no open tfdtape.patched() block",
                f"{len(_state.blocks)} open",
                "Call tfdtape.uninstall() after the blocks close, or leave it "
                "to them: the last block to close restores the state from "
                "before the first"))
        return _uninstall_locked()


@contextlib.contextmanager
def patched():
    """Installs tfdtape inside the block; restores the previous state after.

    Blocks nest and overlap across threads: tfdtape stays installed while any
    is open, and the last to close restores the state from before the first
    opened. An exception raised in the block propagates unchanged; if
    restoring then fails (another patch now wraps tfdtape's functions), the
    PatchConflictError's message is added to it as a note.

    Raises:
        UnsupportedTensorFlowError, PatchConflictError: on entry, as
            `install()`; on exit, PatchConflictError if the state cannot be
            restored and the block raised nothing.
    """
    block = _open_block()
    try:
        yield
    except BaseException as error:
        _close_block(block, error)
        raise
    _close_block(block, None)


def preflight():
    """Checks what install() would check; returns the targets it would keep
    (they hold tfdtape's replacement) or patch.

    Raises:
        UnsupportedTensorFlowError, PatchConflictError: as install() would.
    """
    held, pending = _plan()
    return held + [target for target, _ in pending]


def _open_block():
    """Counts a new open block, installing tfdtape; returns the block's key."""
    with _state.lock:
        if not _state.blocks:
            _state.installed_before_blocks = is_installed()
        _install_locked()
        block = object()
        _state.blocks[block] = threading.get_ident()
        return block


def _close_block(block, error):
    """Closes `block`; the last one restores the state before the first.

    A PatchConflictError from restoring is raised, or added as a note to
    `error`, the exception the block raised.
    """
    with _state.lock:
        del _state.blocks[block]
        if _state.blocks or _state.installed_before_blocks:
            return
        try:
            _uninstall_locked()
        except errors.PatchConflictError as conflict:
            if error is None:
                raise
            errors.add_note(error, f"While leaving tfdtape.patched(): {conflict}")


def _install_locked():
    """install() with the lock held."""
    _, pending = _plan()
    late_imports.watch(_late_package_arrived)
    if not pending:
        return False
    done = []
    try:
        for target, original in pending:
            target.put(target.replacement(original))
            done.append((target, original))
    except BaseException:
        for target, original in reversed(done):
            target.put(original)
        raise
    frame_filters.hide()
    # The stdlib's logger, not absl's: absl's adds a handler to the root
    # logger, which would make the program's own logging.basicConfig() a no-op.
    log = logging.getLogger("tfdtape")
    version = errors.tensorflow_version()
    log.info("tfdtape: installed into TensorFlow %s, replacing %s", version,
             ", ".join(target.symbol for target, _ in pending))
    untested = release_policy.untested_line(version)
    if (untested and not _state.untested_logged and
            not release_policy.reported_elsewhere()):
        _state.untested_logged = True
        log.warning("tfdtape: installed although %s. Run `python -m tfdtape "
                    "verify` to check the patch on this build", untested)
    return True


def _late_package_arrived():
    """Patches the targets a package imported just now brings, if tfdtape is
    installed."""
    with _state.lock:
        if is_installed():
            _install_locked()


def _plan():
    """Checks what install() checks; returns (held, pending): the targets
    holding tfdtape's replacement, and [(target, original)] for the targets
    install() would patch now (those holding TensorFlow's function).

    With tfdtape installed, a target held by another patch is left alone: the
    patch wraps tfdtape's function, or was put there while tfdtape was
    installed. With tfdtape not installed, it is a conflict.
    """
    survey = [(target, target.holder()) for target in targets.patch_targets()]
    held = [target for target, holder in survey if holder == targets.TFDTAPE]
    waiting = [target for target, holder in survey
               if holder in (targets.TENSORFLOW, targets.MISSING)]
    if held and not waiting:
        return held, []
    _check_tensorflow()
    foreign = [target for target, holder in survey
               if holder in (targets.FOREIGN, targets.SCOPED)]
    if foreign and not held:
        what, found, remedy = (
            ("TensorFlow's functions are observed as stock",
             "tfdtape's stock observers", events.NO_INSTALL_REMEDY)
            if any(holder == targets.SCOPED for _, holder in survey) else
            ("another patch holds a function tfdtape replaces",
             ", ".join(targets.describe(target.current()) for target in foreign),
             "tfdtape cannot tell what that patch does with the variable, and "
             "would stop calling it. Import tfdtape before the library that "
             "installed it (its wrapper then wraps tfdtape's function and both "
             "run, that wrapper first), or remove that patch"))
        raise errors.PatchConflictError(errors.message(
            f"cannot install: {what}",
            ", ".join(target.symbol for target in foreign),
            "TensorFlow's own function", found, remedy))
    pending = [(target, target.check()) for target in waiting]
    return held, [(target, original) for target, original in pending
                  if original is not None]


def _check_tensorflow():
    """Raises UnsupportedTensorFlowError for a release the policy refuses,
    or a missing internal."""
    refusal = release_policy.refusal(errors.tensorflow_version())
    if refusal:
        raise errors.UnsupportedTensorFlowError(refusal)
    targets.check_required_symbols()


def _uninstall_locked():
    """uninstall() with the lock held, open blocks not considered: tfdtape's
    replacements, and what open `targets.scoped()` blocks hold, restored."""
    survey = [(target, target.holder(), target.current())
              for target in targets.patch_targets()]
    ours = [(target, current) for target, holder, current in survey
            if holder == targets.TFDTAPE]
    scoped = [(target, target.current()) for target in targets.open_scoped_targets()
              if target.holder() == targets.SCOPED]
    if not ours:
        for target, current in reversed(scoped):
            target.put(targets.original_of(current))
        if scoped:
            events.note_uninstalled()
        return False
    foreign = [(target, current) for target, holder, current in survey
               if holder == targets.FOREIGN]
    if foreign:
        raise errors.PatchConflictError(errors.message(
            "cannot uninstall: another patch replaced tfdtape's",
            ", ".join(target.symbol for target, _ in foreign),
            "tfdtape's replacement",
            ", ".join(targets.describe(current) for _, current in foreign),
            "Remove the other patch first (restore tfdtape's function), "
            "then call tfdtape.uninstall() again"))
    for target, current in reversed(ours + scoped):
        target.put(targets.original_of(current))
    frame_filters.show()
    events.note_uninstalled()
    return True


@process_state.after_fork_in_child
def _keep_the_forking_threads_blocks():
    """In a forked child: only the forking thread's blocks stay open (the
    other threads, which opened the rest, are gone)."""
    forking_thread = threading.get_ident()
    _state.blocks = {block: thread for block, thread in _state.blocks.items()
                     if thread == forking_thread}
