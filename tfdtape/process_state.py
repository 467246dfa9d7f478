"""State a tfdtape module keeps for the life of its process: kept across
`importlib.reload` and made safe in a child of `os.fork()`.

`importlib.reload` runs a module again in its old namespace; a module that
holds state (open blocks, open traces, a lock, what it has noted) reads it
back with `kept(globals(), name, make)` instead of starting afresh.

A forked child has only the thread that forked. A lock another thread held
at the fork would stay held for ever: every lock tfdtape holds comes from
`lock()`, and all of them are made new (unlocked) in the child before the
functions registered with `after_fork_in_child` run, which drop what belonged
to the threads that are gone.
"""

import os
import threading
import weakref


def kept(namespace, name, make):
    """`namespace[name]` where an earlier run of the module left it (a
    reload), else `make()`: the value to bind to `name` at module level."""
    return namespace[name] if name in namespace else make()


# This module's own state survives its own reload the same way.
_locks = kept(globals(), "_locks", weakref.WeakSet)
"""Every lock `lock()` made that is still alive."""
_child_resets = kept(globals(), "_child_resets", dict)
"""(module name, function name) -> function to call in a forked child."""


def lock(reentrant=False):
    """A new `threading.Lock` (or `RLock`) that a forked child gets unlocked."""
    made = threading.RLock() if reentrant else threading.Lock()
    _locks.add(made)
    return made


def after_fork_in_child(function):
    """Registers `function` (a module-level function taking no arguments) to
    run in a forked child after every lock is made new; registering again
    (a reload) replaces the earlier registration. Returns `function`, so it
    serves as a decorator."""
    _child_resets[(function.__module__, function.__qualname__)] = function
    return function


def _in_forked_child():
    for made in list(_locks):
        made._at_fork_reinit()
    for function in list(_child_resets.values()):
        function()


if hasattr(os, "register_at_fork") and not kept(globals(), "_registered", bool):
    os.register_at_fork(after_in_child=_in_forked_child)  # POSIX
    _registered = True
