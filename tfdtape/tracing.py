"""`tfdtape.trace()`: a record of every watch decision tfdtape makes.

While a trace is open, tfdtape's tape functions report each decision here:
explicit watches (`GradientTape.watch` -> `tape.watch_variable`) and
automatic ones (reads -> `tape.variable_accessed`). With no trace open the
only cost on the hot path is reading the module global `active`.

TensorFlow's C++ eager fast path marks a plain (non-distributed)
`ResourceVariable` passed straight into an op, as in `tf.multiply(2.0, v)`,
as read without calling the Python tape functions, so such reads are not
recorded; reads of distributed variables always are.
"""

import contextlib
import dataclasses
import os
import threading
from typing import Optional, Tuple

from tensorflow.python.framework import tensor_util

from tfdtape import compat
from tfdtape import errors
from tfdtape import keras_variables

active = False  # True while at least one trace is open; read on the hot path.
_open_traces = []
_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class WatchEvent:
    """One watch decision.

    Attributes:
        kind: "watch" (explicit GradientTape.watch) or "access" (a read).
        variable: the object TensorFlow handed to the tape (for a read in
            replica context, the replica's component).
        resolved: what the tape watched instead, as `tfdtape.resolve` gives it.
        context: "replica" or "cross-replica".
        replica_id: the replica's index in replica context, else None.
        strategy: the current strategy's class name.
    """
    kind: str
    variable: object
    resolved: Tuple[object, ...]
    context: str
    replica_id: Optional[int]
    strategy: str


class Trace:
    """The events recorded while a `trace()` block was open, in order."""

    def __init__(self):
        self.events = []

    def report(self):
        """A readable table: one row per event, what was watched and where."""
        rows = [("kind", "variable", "shape", "context", "replica",
                 "watched", "devices")]
        for event in self.events:
            rows.append((
                event.kind, _name(event.variable),
                str(getattr(event.variable, "shape", "?")),
                event.context,
                "-" if event.replica_id is None else str(event.replica_id),
                ", ".join(f"{type(w).__name__} {_name(w)}" for w in event.resolved),
                ", ".join(_short_device(w) for w in event.resolved)))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(cell.ljust(width) for cell, width
                                   in zip(row, widths)).rstrip()
                         for row in rows)


def _name(value):
    return keras_variables.label(value)


def _short_device(value):
    device = str(getattr(value, "device", "") or "?")
    return device.split("device:")[-1]


@contextlib.contextmanager
def trace():
    """Records every watch decision made inside the block, from any thread.

    Only tfdtape's tape functions report decisions, so a trace needs tfdtape
    installed; it does not install tfdtape itself, which would change the
    program it observes.

    Yields:
        the `Trace` whose `events` fill in as decisions are made.

    Raises:
        RuntimeError: tfdtape is not installed.
    """
    global active
    from tfdtape import patching  # pylint: disable=g-import-not-at-top
    if not patching.is_installed():
        raise RuntimeError(errors.message(
            "cannot open a trace: tfdtape is not installed", "tfdtape.trace",
            "tfdtape's tape functions in TensorFlow, which report each watch "
            "decision", "TensorFlow's own, which report nothing",
            "Call tfdtape.install() first (`import tfdtape` does, unless "
            "TFDTAPE_AUTOINSTALL=0)"))
    recording = Trace()
    with _lock:
        _open_traces.append(recording)
        active = True
    try:
        yield recording
    finally:
        with _lock:
            if recording in _open_traces:  # A fork closed it in this child.
                _open_traces.remove(recording)
            active = bool(_open_traces)


def record(kind, variable, resolved):
    """Adds one decision to every open trace (called by tfdtape's tape functions)."""
    strategy, replica_context = compat.strategy_context.get_strategy_and_replica_context()
    replica_id = None
    if replica_context is not None:
        replica_id = _replica_index(replica_context)
    event = WatchEvent(kind, variable, tuple(resolved),
                       "cross-replica" if replica_context is None else "replica",
                       replica_id, type(strategy).__name__)
    with _lock:
        for recording in _open_traces:
            recording.events.append(event)


def _replica_index(replica_context):
    replica_id = replica_context.replica_id_in_sync_group
    value = tensor_util.constant_value(replica_id) if not isinstance(
        replica_id, int) else replica_id
    return None if value is None else int(value)


def _close_traces_after_fork():
    """In a forked child: no trace open (the parent's stay the parent's), and
    a fresh lock (a thread that held it does not exist in the child).

    Idempotent, so a reload registering it again does no harm.
    """
    global active, _lock
    _lock = threading.Lock()
    _open_traces.clear()
    active = False


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_close_traces_after_fork)
