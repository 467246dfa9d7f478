"""`tfdtape.trace()`: a record of every watch decision tfdtape makes.

While a trace is open, tfdtape's tape functions report each decision here:
explicit watches (`GradientTape.watch` -> `tape.watch_variable`) and
automatic ones (reads -> `tape.variable_accessed`), and its
`GradientTape.gradient` reports each gradient call. With nothing open the
only cost on the hot path is reading the module global `active`.

What receives the reports is a sink: a `Trace` keeps every watch event;
`tfdtape.recorder.Recorder` (behind `python -m tfdtape run`) only counts
them. `open_sink` / `close_sink` attach and detach one.

TensorFlow's C++ eager fast path marks a plain (non-distributed)
`ResourceVariable` passed straight into an op, as in `tf.multiply(2.0, v)`,
as read without calling the Python tape functions, so such reads are not
recorded; reads of distributed variables always are.
"""

import ast
import contextlib
import dataclasses
import functools
import linecache
import os
import sys
import sysconfig
import threading
from typing import Optional, Tuple

from tensorflow.python import pywrap_tfe
from tensorflow.python.framework import ops
from tensorflow.python.framework import tensor_util
from tensorflow.python.util import tf_stack

from tfdtape import compat
from tfdtape import errors
from tfdtape import keras_variables

# Kept across importlib.reload, so a reload does not drop open traces. A
# tuple, replaced whole under the lock, so reporting reads it without one.
_open_sinks = tuple(globals().get("_open_sinks", ()))
active = bool(_open_sinks)  # True while a sink is open; read on the hot path.
_lock = globals().get("_lock") or threading.Lock()


@dataclasses.dataclass(frozen=True)
class WatchEvent:
    """One watch decision.

    Attributes:
        kind: "watch" (explicit GradientTape.watch) or "access" (a read).
        variable: the object TensorFlow handed to the tape (for a read in
            replica context, the replica's component).
        resolved: what the tape watched instead, as `tfdtape.resolve` gives it.
        context: "replica" (inside strategy.run), "cross-replica" (inside
            strategy.scope(), outside run) or "no strategy".
        replica_id: the replica's index in replica context, else None.
        strategy: the current strategy's class name.
        taped: whether a tape was recording in this thread (TensorFlow
            reports reads whether or not one is).
    """
    kind: str
    variable: object
    resolved: Tuple[object, ...]
    context: str
    replica_id: Optional[int]
    strategy: str
    taped: bool = True


@dataclasses.dataclass(frozen=True)
class GradientEvent:
    """One `GradientTape.gradient` call, as far as the report needs it.

    Attributes:
        none_reasons: (source, reason, message) for every source whose
            gradient is None, reasons as `tfdtape.explain` gives them.
        totals: (source, number of components) for every source that got a
            cross-replica total derivative.
        location: "file:line" of the call in the user's code.
        context: "replica", "cross-replica" or "no strategy".
    """
    none_reasons: Tuple[Tuple[object, str, str], ...]
    totals: Tuple[Tuple[object, int], ...]
    location: str
    context: str


class Trace:
    """The events recorded while a `trace()` block was open, in order.

    Attributes:
        events: the WatchEvents.
        complete: False once tfdtape was uninstalled while the trace was
            open: decisions TensorFlow's own functions took then are missing.
    """

    def __init__(self):
        self.events = []
        self.complete = True

    def add_event(self, event):
        """Keeps a WatchEvent (list.append is atomic: no lock needed)."""
        self.events.append(event)

    def add_gradient(self, event):
        """Gradient calls are not part of a trace."""
        del event

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
        table = "\n".join("  ".join(cell.ljust(width) for cell, width
                                    in zip(row, widths)).rstrip()
                          for row in rows)
        if self.complete:
            return table
        return (f"{INCOMPLETE_NOTE}\n{table}")


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
    from tfdtape import patching  # pylint: disable=g-import-not-at-top
    observers = sys.modules.get("tfdtape.observers")
    if not patching.is_installed() and observers and observers.observing():
        raise RuntimeError(errors.message(
            "cannot open a trace: tfdtape is not installed", "tfdtape.trace",
            "tfdtape's tape functions in TensorFlow, which report each watch "
            "decision", "TensorFlow's own, observed as stock",
            observers.NO_INSTALL_REMEDY))
    if not patching.is_installed():
        raise RuntimeError(errors.message(
            "cannot open a trace: tfdtape is not installed", "tfdtape.trace",
            "tfdtape's tape functions in TensorFlow, which report each watch "
            "decision", "TensorFlow's own, which report nothing",
            "Call tfdtape.install() first (`import tfdtape` does, unless "
            "TFDTAPE_AUTOINSTALL=0)"))
    recording = Trace()
    open_sink(recording)
    try:
        yield recording
    finally:
        close_sink(recording)


INCOMPLETE_NOTE = ("note: tfdtape was uninstalled while this was recording; "
                   "what the tapes did after that is missing")


def note_uninstalled():
    """Marks every open sink incomplete (called when tfdtape is uninstalled:
    TensorFlow's own functions report nothing)."""
    for sink in _open_sinks:
        sink.complete = False


def open_sink(sink):
    """Starts sending every report to `sink` (its add_event / add_gradient)."""
    global active, _open_sinks
    with _lock:
        _open_sinks += (sink,)
        active = True


def close_sink(sink):
    """Stops sending reports to `sink`; a sink a fork already closed is fine."""
    global active, _open_sinks
    with _lock:
        _open_sinks = tuple(open_sink_ for open_sink_ in _open_sinks
                            if open_sink_ is not sink)
        active = bool(_open_sinks)


def record(kind, variable, resolved):
    """Sends one decision to every open sink (called by tfdtape's tape functions)."""
    # The strategy stack, read as tfdtape.resolution reads it: cheaper than
    # the public context functions, which matters with a recorder open.
    stack = ops.get_default_graph()._distribution_strategy_stack  # pylint: disable=protected-access
    replica_id = None
    if not stack:
        context, strategy_name = "no strategy", _default_strategy_name()
    else:
        mode = stack[-1]
        strategy_name = type(mode.strategy).__name__
        if mode.replica_context is None:
            context = "cross-replica"
        else:
            context = "replica"
            replica_id = _replica_index(mode.replica_context)
    event = WatchEvent(kind, variable, tuple(resolved), context, replica_id,
                       strategy_name, not pywrap_tfe.TFE_Py_TapeSetIsEmpty())
    for sink in _open_sinks:
        sink.add_event(event)


def _default_strategy_name():
    """The class name of the default strategy (what runs with no strategy)."""
    global _DEFAULT_STRATEGY_NAME
    if _DEFAULT_STRATEGY_NAME is None:
        _DEFAULT_STRATEGY_NAME = type(
            compat.strategy_context._get_default_strategy()).__name__  # pylint: disable=protected-access
    return _DEFAULT_STRATEGY_NAME


_DEFAULT_STRATEGY_NAME = None


def record_gradient(event):
    """Sends one GradientEvent to every open sink."""
    for sink in _open_sinks:
        sink.add_gradient(event)


def caller_location(frame):
    """'file:line' of the innermost frame from `frame` outwards that is user
    code, or '?' if there is none.

    Frames in TensorFlow's, Keras's and tfdtape's package folders and in the
    standard library (a replica thread's `threading` frames) are not user
    code. A frame in AutoGraph's generated code stands for the statement of
    the user's function it was converted from, found through TensorFlow's
    source maps of the conversions under way (in any thread: a replica
    function converted with its caller runs in a replica thread); a
    generated frame no map covers gives '?', since the line it stands for
    is unknown.
    """
    libraries = _library_folders()
    while frame is not None:
        filename = frame.f_code.co_filename
        if "__autograph_generated" in filename:
            origin = _autograph_origin(filename, frame.f_lineno)
            if origin is None:
                return "?"
            if _is_user_file(origin[0], libraries):
                return f"{origin[0]}:{_statement_start(origin[0], origin[1])}"
        elif _is_user_file(filename, libraries):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def _is_user_file(filename, libraries):
    if filename.startswith(libraries) or filename.startswith("<frozen "):
        return False
    return not (filename.startswith(_standard_library_folders()) and
                "site-packages" not in filename and
                "dist-packages" not in filename)


def _library_folders():
    """The folders of the loaded packages whose frames are not user code."""
    folders = []
    for name in ("tensorflow", "keras", "tf_keras", "tfdtape"):
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if path:
            folders.append(os.path.dirname(path) + os.sep)
    return tuple(folders)


@functools.lru_cache(maxsize=None)
def _standard_library_folders():
    paths = sysconfig.get_paths()
    return tuple({os.path.join(paths[key], "") for key in ("stdlib", "platstdlib")})


def _autograph_origin(filename, line):
    """(file, line, function) that line `line` of AutoGraph's generated
    `filename` was converted from, or None: looked up in the source maps of
    the conversions under way, this thread's first."""
    # pylint: disable=protected-access
    stacks = tf_stack._source_mapper_stacks
    own = stacks.get(tf_stack._get_thread_key())
    for stack in [own] + list(stacks.values()):
        if stack:
            origin = stack[-1].get_effective_source_map().get((filename, line))
            if origin is not None:
                return origin
    return None


def _statement_start(filename, line):
    """The first line of the innermost statement of `filename` that spans
    `line` (AutoGraph maps a call spread over lines to its last line)."""
    return _statement_starts(filename).get(line, line)


@functools.lru_cache(maxsize=64)
def _statement_starts(filename):
    """{line: first line of the innermost statement spanning it}."""
    try:
        tree = ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return {}
    starts = {}
    for node in ast.walk(tree):  # outer statements first, inner ones overwrite
        if isinstance(node, ast.stmt):
            for spanned in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                if starts.get(spanned, 0) <= node.lineno:
                    starts[spanned] = node.lineno
    return starts


def _replica_index(replica_context):
    """The replica's index: the context's own int where it keeps one (the
    public property builds a tensor on every call), else the tensor's
    constant value."""
    replica_id = getattr(replica_context, "_replica_id_in_sync_group", None)
    if not isinstance(replica_id, int):
        replica_id = replica_context.replica_id_in_sync_group
        if not isinstance(replica_id, int):
            replica_id = tensor_util.constant_value(replica_id)
    return None if replica_id is None else int(replica_id)


def _close_traces_after_fork():
    """In a forked child: no trace open (the parent's stay the parent's), and
    a fresh lock (a thread that held it does not exist in the child).

    Idempotent, so a reload registering it again does no harm.
    """
    global active, _lock, _open_sinks
    _lock = threading.Lock()
    _open_sinks = ()
    active = False


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_close_traces_after_fork)
