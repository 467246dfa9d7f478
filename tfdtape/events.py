"""Where tfdtape's tape functions report what they do: the open sinks.

While a sink is open, tfdtape's tape functions report each decision here:
explicit watches (`GradientTape.watch` -> `tape.watch_variable`) and
automatic ones (reads -> `tape.variable_accessed`), and its
`GradientTape.gradient` reports each gradient call. With nothing open the
only cost on the hot path is reading the module global `active`.

What receives the reports is a sink: a `tfdtape.traces.Trace` (behind
`tfdtape.trace()`) keeps every watch event; `tfdtape.cli.event_counts.EventCounts`
(behind `python -m tfdtape run`) only counts them. `open_sink` /
`close_sink` attach and detach one. This module reports; it does not know
whether tfdtape is installed (`tfdtape.traces` asks `tfdtape.patching`).

TensorFlow's C++ eager fast path marks a plain (non-distributed)
`ResourceVariable` passed straight into an op, as in `tf.multiply(2.0, v)`,
as read without calling the Python tape functions, so such reads are not
recorded; reads of distributed variables always are.
"""

import contextlib
import dataclasses
import sys
import threading
import types

from tensorflow.python import pywrap_tfe
from tensorflow.python.framework import ops
from tensorflow.python.framework import tensor_util

from tfdtape import call_sites
from tfdtape import compat
from tfdtape import process_state

# Kept across importlib.reload, so a reload does not drop open traces. A
# tuple, replaced whole under the lock, so reporting reads it without one.
_open_sinks = process_state.kept(globals(), "_open_sinks", tuple)
active = bool(_open_sinks)  # True while a sink is open; read on the hot path.


def _wants_untaped(sinks):
    """Whether a sink keeps reads made while no tape records (a trace does;
    the run recorder, whose `records_untaped` is False, does not)."""
    return any(getattr(sink, "records_untaped", True) for sink in sinks)


_untaped_wanted = _wants_untaped(_open_sinks)

observing_stock = process_state.kept(globals(), "observing_stock", bool)
"""True while `tfdtape.cli.stock_observers.observe_stock()` reports stock TensorFlow
here (a `python -m tfdtape run --no-install` run)."""

NO_INSTALL_REMEDY = (
    "This process runs under `python -m tfdtape run --no-install`, which "
    "observes stock TensorFlow and keeps tfdtape out: run without "
    "--no-install to have tfdtape installed")
"""What to do when tfdtape is asked for inside a --no-install run."""
_lock = process_state.kept(globals(), "_lock", process_state.lock)


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
    resolved: tuple[object, ...]
    context: str
    replica_id: int | None
    strategy: str
    taped: bool = True


@dataclasses.dataclass(frozen=True)
class GradientEvent:
    """One `GradientTape.gradient` call, as far as the report needs it.

    The library states the facts; a sink that wants to know why a gradient
    is None asks `tfdtape.explaining.none_reasons` inside `add_gradient`,
    while `tape` still records as it did. `tape`, `recorded` and
    `gradients` are not for keeping beyond that call.

    Attributes:
        tape: the GradientTape.
        recorded: its `_tape` from before the call (a non-persistent tape
            drops it), which still knows what it watched.
        asked: the call's flat sources.
        gradients: the call's flat results, in the order of `asked`.
        summing: whether distributed sources were differentiated by all
            their components (outside replica context, tfdtape's gradient).
        totals: (source, number of components) for every source that got a
            cross-replica total derivative.
        location: "file:line" of the call in the user's code.
        context: "replica", "cross-replica" or "no strategy".
        one_device: a cross-replica total derivative only one component of
            a several-component variable took part in: the step ran on one
            device (no strategy.run).
        sources: the call's flat sources, where the sink is to name the
            variables a Keras variable wraps by its path and note plain
            variables among them (tfdtape's gradient; empty from the stock
            observers).
        around_run: the tape recorded the replicas of a strategy.run it
            was recording around.
        workers: how many workers the totals were all-reduced across (1:
            within this process).
    """
    tape: object
    recorded: object
    asked: tuple[object, ...]
    gradients: tuple[object, ...]
    summing: bool
    totals: tuple[tuple[object, int], ...]
    location: str
    context: str
    one_device: bool = False
    sources: tuple[object, ...] = ()
    around_run: bool = False
    workers: int = 1


@dataclasses.dataclass(frozen=True)
class RefusalEvent:
    """An error tfdtape raised instead of a silent wrong answer (whether or
    not the program caught it).

    Attributes:
        message: the first line of the error's message.
        location: "file:line" of the call in the user's code that raised it.
    """
    message: str
    location: str


@dataclasses.dataclass(frozen=True)
class WarningEvent:
    """Something a program does that trains silently unlike one device
    (`tfdtape.cli.scale_traps`, `tfdtape.cli.replica_clipping`).

    Attributes:
        kind: what it is, one of those modules' kinds.
        location: "file:line" of the call in the user's code.
        subject: what it concerns where the kind names one (an optimizer and
            its option), else None.
    """
    kind: str
    location: str
    subject: str | None = None


@dataclasses.dataclass(frozen=True)
class ReductionEvent:
    """A `StrategyExtended.reduce_to` (what `strategy.reduce` calls), told to
    the reduction listeners while a sink is open.

    Attributes:
        reduce_op: the reduction, as the caller gave it ("MEAN", ReduceOp.SUM).
        value: what is reduced.
        spanning: a tape recording around a strategy.run records here.
        frame: the frame of tfdtape's reduce_to (not for keeping), from which
            a warning locates the user's call.
    """
    reduce_op: object
    value: object
    spanning: bool
    frame: object


INCOMPLETE_NOTE = ("note: tfdtape was uninstalled while this was recording; "
                   "what the tapes did after that is missing")


def note_uninstalled():
    """Marks every open sink incomplete (called when tfdtape is uninstalled:
    TensorFlow's own functions report nothing)."""
    for sink in _open_sinks:
        sink.complete = False


def open_sink(sink):
    """Starts sending every report to `sink` (its add_event / add_gradient)."""
    global active, _open_sinks, _untaped_wanted
    with _lock:
        _open_sinks += (sink,)
        _untaped_wanted = _wants_untaped(_open_sinks)
        active = True


def close_sink(sink):
    """Stops sending reports to `sink`; a sink a fork already closed is fine."""
    global active, _open_sinks, _untaped_wanted
    with _lock:
        _open_sinks = tuple(open_sink_ for open_sink_ in _open_sinks
                            if open_sink_ is not sink)
        _untaped_wanted = _wants_untaped(_open_sinks)
        active = bool(_open_sinks)


_reduction_listeners = process_state.kept(globals(), "_reduction_listeners", tuple)


@contextlib.contextmanager
def listening_for_reductions(listener):
    """Inside the block, `listener(ReductionEvent)` hears of every reduction
    made while a sink is open."""
    global _reduction_listeners
    with _lock:
        _reduction_listeners += (listener,)
    try:
        yield
    finally:
        with _lock:
            _reduction_listeners = tuple(heard for heard in _reduction_listeners
                                         if heard is not listener)


def reductions_heard():
    """Whether a reduction made now would be heard (`record_reduction`)."""
    return active and bool(_reduction_listeners)


def record_reduction(reduce_op, value, spanning, frame):
    """Tells every reduction listener of one reduction (`ReductionEvent`)."""
    event = ReductionEvent(reduce_op, value, spanning, frame)
    for listener in _reduction_listeners:
        listener(event)


def record(kind, variable, resolved):
    """Sends one decision to every open sink (called by tfdtape's tape
    functions); a read while no tape records is not even described unless
    a sink keeps such reads."""
    taped = not pywrap_tfe.TFE_Py_TapeSetIsEmpty()
    if not taped and not _untaped_wanted:
        return
    # The strategy stack, read as tfdtape.resolution reads it: cheaper than
    # the public context functions, which matters with a recorder open.
    stack = ops.get_default_graph()._distribution_strategy_stack
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
                       strategy_name, taped)
    for sink in _open_sinks:
        sink.add_event(event)


def context_now():
    """Where code runs now: "cross-replica", "replica" or "no strategy"."""
    if compat.strategy_context.get_replica_context() is None:
        return "cross-replica"
    if compat.strategy_context.has_strategy():
        return "replica"
    return "no strategy"


def _default_strategy_name():
    """The class name of the default strategy (what runs with no strategy)."""
    global _DEFAULT_STRATEGY_NAME
    if _DEFAULT_STRATEGY_NAME is None:
        _DEFAULT_STRATEGY_NAME = type(
            compat.strategy_context._get_default_strategy()).__name__
    return _DEFAULT_STRATEGY_NAME


_DEFAULT_STRATEGY_NAME = None


# Per thread, `.found`: what `gradient_totals()` collects into, if open.
_collecting = process_state.kept(globals(), "_collecting", threading.local)


@contextlib.contextmanager
def gradient_totals():
    """Collects what the `tape.gradient` calls inside the block, in this
    thread, summed: yields a namespace whose `totals` lists (source, number
    of components) for each total derivative, and whose `summing` says
    whether a call differentiated distributed sources by their components
    (outside replica context, with tfdtape's gradient in place)."""
    outer = getattr(_collecting, "found", None)
    found = _collecting.found = types.SimpleNamespace(totals=[], summing=False)
    try:
        yield found
    finally:
        _collecting.found = outer


def note_totals(totals, summing):
    """Adds one gradient call's total derivatives, and whether it summed, to
    the open `gradient_totals()` block of this thread, if any."""
    found = getattr(_collecting, "found", None)
    if found is not None:
        found.totals.extend(totals)
        found.summing = found.summing or summing


def record_gradient(event):
    """Sends one GradientEvent to every open sink."""
    for sink in _open_sinks:
        sink.add_gradient(event)


def refused(error):
    """Reports `error`, which tfdtape is about to raise, to the open sinks
    (with the user's call that led to it); returns it for the raise."""
    if _open_sinks:
        text = str(error).strip()
        event = RefusalEvent(text.splitlines()[0] if text else type(error).__name__,
                             call_sites.caller_location(sys._getframe(1)))
        for sink in _open_sinks:
            sink.add_refusal(event)
    return error


def warn(kind, frame, subject=None):
    """Sends a WarningEvent of `kind` about `subject`, located at the user's
    code from `frame` outwards, to every open sink."""
    event = WarningEvent(kind, call_sites.caller_location(frame), subject)
    for sink in _open_sinks:
        sink.add_warning(event)


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


@process_state.after_fork_in_child
def _close_traces_after_fork():
    """In a forked child: no trace open (the parent's stay the parent's)."""
    global active, _open_sinks, _untaped_wanted
    _open_sinks = ()
    _untaped_wanted = False
    active = False
