"""Tapes that record the replicas of a `strategy.run` called while they record.

MirroredStrategy (and MultiWorkerMirroredStrategy) runs each replica function
of a `strategy.run` in a thread of its own, eagerly and while a `tf.function`
is traced, and a gradient tape records only the thread it was pushed in. So a
tape recording around `strategy.run` (the loop most people write first) would
record nothing the replicas compute.

`mirrored_run` runs its replica threads one at a time (never two at once, nor
together with the calling thread), so tfdtape lets such tapes record in each
replica thread for exactly the duration of that replica's function: the
tapes recording in the calling thread outside replica context, pushed in the
graph `strategy.run` runs in (eagerly: the eager tapes; while a `tf.function`
is traced: those opened inside it, around the `tf.cond` or loop it may run
in). Not propagated: tapes paused by
`stop_recording()` (they are popped), any tape while the thread's recording is
stopped (`tf.init_scope`), tapes of other threads, and tapes opened inside
replica context. A `tf.function` passed to `strategy.run` traces its replicas
in a graph of its own, so a tape outside it records its call as one
operation, as before.

Outside replica context `tfdtape.gradient_tape` differentiates a
distributed variable by all its components, so such a tape's gradient is the
total derivative over the replicas, and its `watched_variables()` lists a
distributed variable once, not once per replica's handle. The tape is
counted (`spanned_runs`) for the run report, and so that an error of its
backward pass can say where the tape belongs (`BACKWARD_NOTE`).
"""

import contextlib
import functools
import threading

from tensorflow.python import pywrap_tfe
from tensorflow.python.eager import tape as tape_module
from tensorflow.python.framework import ops
from tensorflow.python.ops import control_flow_v2_func_graphs
from tensorflow.python.util import traceback_utils

from tfdtape import backward_placement
from tfdtape import compat
from tfdtape import errors
from tfdtape import events
from tfdtape import process_state
from tfdtape import resolution

_SPANNED_RUNS = "_tfdtape_spanned_runs"
"""On a GradientTape: how many strategy.run calls it recorded the replicas of
since it was (re)started."""

BACKWARD_NOTE = (
    "tfdtape: this tape recorded the replicas of a strategy.run, and their "
    "backward pass runs here, outside the replicas. Operations that "
    "communicate across replicas inside the replica function "
    "(ReplicaContext.all_gather, the collectives of a merge_call of your "
    "own; ReplicaContext.all_reduce and synchronized BatchNormalization "
    "while a tape is also open inside the replica function) cannot be "
    "differentiated from here: open the tape inside the function you pass "
    "to strategy.run, and all-reduce the gradients there (as the optimizer "
    "does).")
"""Added to an error raised by such a tape's gradient that
`is_cross_replica_backward_error` recognises."""

_CROSS_REPLICA_SIGNS = ("call_for_each_replica", "merge_call", "replica context",
                        "Mismatching tf.distribute.Strategy", "Mismatching ReplicaContext",
                        "Collective", "Nccl",
                        "attribute 'all_reduce'", "attribute 'all_gather'")
"""Words of TensorFlow's errors for a collective or merge_call differentiated
outside the replicas: replica-context checks (`merge_call` needs to be inside
`call_for_each_replica()`; outside any strategy, the default strategy's
context is not the run's; in cross-replica context there is no replica
context to call `all_reduce` on; another replica context than the one the
collective ran in), and collective ops with no gradient."""


def is_cross_replica_backward_error(error):
    """Whether `error`, raised by the gradient of a tape that recorded the
    replicas, is TensorFlow's for an operation that communicates across
    replicas (not tfdtape's own refusals, nor errors of other causes)."""
    text = str(error)
    return not errors.is_tfdtape_error(error) and any(
        sign in text for sign in _CROSS_REPLICA_SIGNS)


# Kept across importlib.reload: the tapes already recording stay known.
_recording = process_state.kept(globals(), "_recording", threading.local)
"""Per thread, `.tapes`: (GradientTape, the graph it was pushed in) for the
tapes recording there now (pushed outside replica context); `.run`: the
`_SpannedRun` whose replica function this thread runs; `.merging`: the
`_SpannedRun` this thread called (and runs the merge_call functions of)."""


class _SpannedRun:
    """A `strategy.run` whose replicas tapes around it record, shared by the
    thread that called it and its replica threads."""

    def __init__(self):
        self.inner_tapes = {}
        """{replica thread id: the tapes opened in that replica that record
        now}. Per thread: the replica threads take turns between merge
        points, so one replica may look while another's tape is still open
        at an earlier point of the same program."""

    def inner_tapes_here(self):
        """The list of this thread's tapes opened inside its replica."""
        return self.inner_tapes.setdefault(threading.get_ident(), [])


def tapes_pushed_here():
    """(GradientTape, the graph it was pushed in) for each tape recording in
    this thread now, pushed outside replica context (the list itself)."""
    tapes = getattr(_recording, "tapes", None)
    if tapes is None:
        tapes = _recording.tapes = []
    return tapes


def tape_pushed(tape, is_new):
    """Notes that `tape` (a GradientTape) records in this thread from now on.

    A tape pushed in the replica context of a strategy (inside
    `strategy.run`) is not noted among this thread's: its own thread is the
    replica's; inside the replicas of a run that tapes around it record, it
    is noted on the run.

    Args:
        tape: the GradientTape.
        is_new: True when it starts on a fresh tape (first use or reset()),
            which forgets the runs it recorded before.
    """
    if is_new:
        tape.__dict__.pop(_SPANNED_RUNS, None)
    graph = ops.get_default_graph()
    stack = graph._distribution_strategy_stack
    if stack and stack[-1].replica_context is not None:
        run = getattr(_recording, "run", None)
        if run is not None:
            run.inner_tapes_here().append(tape)
        return
    tapes_pushed_here().append((tape, graph))


def tape_popped(tape):
    """Notes that `tape` (a GradientTape) stopped recording in this thread."""
    tapes = tapes_pushed_here()
    for index, (recording, _) in enumerate(tapes):
        if recording is tape:
            del tapes[index]
            return
    run = getattr(_recording, "run", None)
    inner = run.inner_tapes_here() if run is not None else []
    for index, recording in enumerate(inner):
        if recording is tape:
            del inner[index]
            return


def make_push_accumulator(original):
    """Returns a `ForwardAccumulator._push_accumulator` that notes, inside
    the replicas of a run that tapes around it record, the accumulator
    among the replica's own recorders: forward-mode derivatives of a
    collective need TensorFlow's path, inside the replica."""

    @functools.wraps(original)
    def _push_accumulator(self):
        original(self)
        run = getattr(_recording, "run", None)
        if run is not None:
            run.inner_tapes_here().append(self)

    return _push_accumulator


def make_pop_accumulator(original):
    """Returns a `ForwardAccumulator._pop_accumulator` that forgets what
    `make_push_accumulator`'s version noted."""

    @functools.wraps(original)
    def _pop_accumulator(self):
        original(self)
        tape_popped(self)

    return _pop_accumulator


@contextlib.contextmanager
def differentiating_replicas():
    """Inside the block, this thread computes the backward pass of a tape
    that recorded the replicas of a `strategy.run` (outside them)."""
    _recording.differentiating = getattr(_recording, "differentiating", 0) + 1
    try:
        yield
    finally:
        _recording.differentiating -= 1


def check_not_differentiating_replicas(replica_context, symbol):
    """Raises ValueError if this thread computes the backward pass of a
    tape that recorded the replicas and `replica_context` is the default
    strategy's: a collective run there (by `tf.recompute_grad` recomputing
    the replica's forward pass, or by a backward function of the
    program's) runs outside the replicas, where it would reduce nothing.
    (The run's own replica context, captured by TensorFlow's gradient of a
    collective, raises TensorFlow's error, which gets `BACKWARD_NOTE`.)"""
    if (not getattr(_recording, "differentiating", 0) or
            replica_context._strategy is not
            compat.strategy_context._get_default_strategy()):
        return
    raise events.refused(ValueError(errors.message(
        "cannot run a collective in the backward pass of a tape around "
        "strategy.run", symbol,
        "collectives inside the replicas, where every replica takes part",
        "one in the backward pass of a tape that recorded the replicas of a "
        "strategy.run (tf.recompute_grad recomputing the replica function's "
        "operations, or a backward function of tf.custom_gradient), which "
        "runs outside the replicas, where it would reduce nothing",
        "Keep collectives out of recomputed and custom-gradient functions, "
        "or open the tape inside the function you pass to strategy.run")))


def only_spanning_tapes_record_here():
    """Whether this thread runs the replica function of a `strategy.run`
    that tapes around it record, and no tape opened inside this replica
    records too."""
    run = getattr(_recording, "run", None)
    return run is not None and not run.inner_tapes_here()


def merging_for_spanned_replicas():
    """Whether this thread runs a `merge_call` function for the replicas of
    a `strategy.run` that tapes around it record (and no tape opened inside
    its replicas records too; at a merge point every replica has reached the
    same point of the program): its cross-device transfers are then recorded
    here, on those tapes (`tfdtape.collectives`)."""
    run = getattr(_recording, "merging", None)
    return run is not None and not any(run.inner_tapes.values())


def merging_for_a_run():
    """Whether this thread runs a `merge_call` function for the replicas of
    a `strategy.run` that tapes around it record."""
    return getattr(_recording, "merging", None) is not None


@contextlib.contextmanager
def _noted(attribute, run):
    """Inside the block, this thread's `attribute` is `run`."""
    previous = getattr(_recording, attribute, None)
    setattr(_recording, attribute, run)
    try:
        yield
    finally:
        setattr(_recording, attribute, previous)


def spanned_runs(tape):
    """How many `strategy.run` calls `tape` recorded the replicas of since it
    was last (re)started; 0 for any other tape."""
    return tape.__dict__.get(_SPANNED_RUNS, 0)


def spanning_tapes_record_here():
    """Whether a tape that recorded the replicas of a strategy.run records
    in this thread now."""
    return (not pywrap_tfe.TFE_Py_TapeSetIsStopped() and
            any(spanned_runs(tape) > 0 and tape._tape is not None
                for tape, _ in tapes_pushed_here()))


def recording_tapes_here():
    """The tapes of this thread that record what runs here now (a
    strategy.run starting, a read), while the thread's recording is on:
    those pushed outside replica context in the current
    graph, or in a graph it is control flow of (a `tf.cond` branch or
    `tf.while_loop` body traced inside the function the tape records, as it
    would record the same ops in its own thread)."""
    tapes = tapes_pushed_here()
    if not tapes or pywrap_tfe.TFE_Py_TapeSetIsStopped():
        return []
    graphs = _recording_graphs(ops.get_default_graph())
    return [tape for tape, pushed_in in tapes
            if any(pushed_in is graph for graph in graphs) and
            tape._tape is not None]


def _recording_graphs(graph):
    """`graph`, and while it is a control-flow graph the graphs around it, up
    to and including the first that is not (a `tf.function`'s, or eager)."""
    graphs = [graph]
    while isinstance(graph, control_flow_v2_func_graphs.ControlFlowFuncGraph):
        graph = graph.outer_graph
        graphs.append(graph)
    return graphs


def make_call_for_each_replica(original):
    """Returns a `mirrored_run._call_for_each_replica` whose replica functions
    record on the tapes recording in the calling thread."""

    @functools.wraps(original)
    def _call_for_each_replica(distribution, fn, args, kwargs):
        tapes = recording_tapes_here()
        if not tapes:
            return original(distribution, fn, args, kwargs)
        for tape in tapes:
            tape.__dict__[_SPANNED_RUNS] = spanned_runs(tape) + 1
        run = _SpannedRun()
        with _noted("merging", run):
            return original(distribution, _recorded_by(tapes, distribution, fn, run),
                            args, kwargs)

    # An error of a replica function reaches the user without this frame.
    return traceback_utils.filter_traceback(_call_for_each_replica)


def _recorded_by(tapes, distribution, fn, run):
    """`fn`, recording on `tapes` (GradientTapes) in the thread that calls it,
    for exactly the duration of the call; nothing is left pushed if it
    raises.

    The variables of `distribution` a tape watched before the run (an
    explicit `tape.watch(v)` outside the replicas watches `v` through the
    first component's handle only) are watched in each replica too, through
    that replica's component, so that a tape that does not watch what it
    reads still records every replica's share. The replica threads note
    `run` (a `_SpannedRun`).
    """
    recorded = [(tape._tape, [
        variable for variable in resolution.watched_by(tape)
        if resolution.is_distributed_variable(variable) and
        variable.distribute_strategy is distribution]) for tape in tapes]

    def replica_fn(*args, **kwargs):
        pushed = []
        try:
            for tape, watched in recorded:
                tape_module.push_tape(tape)
                pushed.append(tape)
                for variable in watched:  # its handle here: this replica's
                    pywrap_tfe.TFE_Py_TapeWatchVariable(tape._tape, variable)
            with _noted("run", run), backward_placement.recording_replica():
                return fn(*args, **kwargs)
        finally:
            for tape in reversed(pushed):
                tape_module.pop_tape(tape)

    return replica_fn
