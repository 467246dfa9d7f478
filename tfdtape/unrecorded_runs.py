"""What no tape recorded: the replicas of a `strategy.run` called while the
tape records in the same thread.

MirroredStrategy (and MultiWorkerMirroredStrategy) runs each replica
function of a `strategy.run` in a thread of its own — eagerly, and also when
a `tf.function` is traced — and a gradient tape records only the operations
of the thread it was opened in. A tape that records while its own thread
calls `strategy.run` therefore records nothing the replicas compute —
whether they read a distributed variable or a tensor computed from one —
and a gradient through them would silently come out None, or partial.

tfdtape marks the tapes recording in the calling thread (outside replica
context) when a `strategy.run` starts there: all of them when it runs
eagerly, and, while a `tf.function` is traced, those opened inside that same
function. `check` refuses a cross-replica gradient with respect to a
distributed variable from a marked tape. A tape opened outside a
`tf.function` records the function's call as a whole (replicas included), so
a `strategy.run` traced inside it marks nothing; neither does a
`strategy.run` in another thread.
"""

import threading

from tensorflow.python.eager import context
from tensorflow.python.eager import def_function
from tensorflow.python.framework import ops
from tensorflow.python.util import traceback_utils

from tfdtape import errors
from tfdtape import keras_variables
from tfdtape import resolution
from tfdtape import tracing

_MISSED_RUN = "_tfdtape_missed_strategy_run"
"""On a GradientTape: 'eager' or 'traced', how the missed strategy.run ran."""

# Kept across importlib.reload: the tapes already recording stay known.
_recording = globals().get("_recording") or threading.local()
"""Per thread, `.tapes`: (GradientTape, the graph it was pushed in) for the
tapes recording there now (pushed outside replica context)."""


def _tapes_here():
    tapes = getattr(_recording, "tapes", None)
    if tapes is None:
        tapes = _recording.tapes = []
    return tapes


def tape_pushed(tape, is_new):
    """Notes that `tape` (a GradientTape) records in this thread from now on.

    A tape pushed in the replica context of a strategy (inside
    `strategy.run`) is not noted: it cannot call `strategy.run` itself.

    Args:
        tape: the GradientTape.
        is_new: True when it starts on a fresh tape (first use or reset()),
            which forgets a `strategy.run` it recorded before.
    """
    if is_new:
        tape.__dict__.pop(_MISSED_RUN, None)
    graph = ops.get_default_graph()
    stack = graph._distribution_strategy_stack  # pylint: disable=protected-access
    if stack and stack[-1].replica_context is not None:
        return
    _tapes_here().append((tape, graph))


def tape_popped(tape):
    """Notes that `tape` (a GradientTape) stopped recording in this thread."""
    tapes = _tapes_here()
    for index, (recording, _) in enumerate(tapes):
        if recording is tape:
            del tapes[index]
            return


def make_call_for_each_replica(original):
    """Returns a `mirrored_run.call_for_each_replica` that marks the tapes
    recording in the calling thread that will miss the replicas."""

    def call_for_each_replica(strategy, fn, args=None, kwargs=None):
        if not isinstance(fn, def_function.Function):  # else one function call
            if context.executing_eagerly():
                for tape, _ in _tapes_here():
                    tape.__dict__[_MISSED_RUN] = "eager"
            else:
                graph = ops.get_default_graph()
                for tape, pushed_in in _tapes_here():
                    if pushed_in is graph:
                        tape.__dict__[_MISSED_RUN] = "traced"
        return original(strategy, fn, args, kwargs)

    call_for_each_replica.__doc__ = original.__doc__
    # An error of a replica function reaches the user without this frame.
    return traceback_utils.filter_traceback(call_for_each_replica)


def check(tape, sources, symbol):
    """Raises if `tape` missed the replicas of a `strategy.run` and `sources`
    hold a distributed variable (or a Keras variable wrapping one).

    Args:
        tape: the GradientTape a cross-replica gradient is taken from.
        sources: the gradient's flat sources, as the user passed them.
        symbol: the API the user called, named in the message.

    Raises:
        ValueError: the tape cannot have recorded what the replicas of that
            `strategy.run` computed.
    """
    missed = tape.__dict__.get(_MISSED_RUN)
    if not missed:
        return
    where = ("an eager strategy.run" if missed == "eager" else
             "a strategy.run inside the tf.function the tape was opened in")
    remedy = ("Open the tape and take the gradient inside the function you "
              "pass to strategy.run, or run the whole step (strategy.run "
              "included) in a tf.function and open the tape outside it")
    for source in sources:
        if resolution.is_distributed_variable(
                keras_variables.unwrap(source, symbol)):
            raise tracing.refused(ValueError(errors.message(
                f"cannot take a cross-replica gradient through {where}", symbol,
                "a tape that recorded everything between "
                f"{keras_variables.label(source)!r} and the target",
                f"a tape that was recording when {where} ran its replicas in "
                "threads the tape does not record, so the gradient would be "
                "missing (None or partial)", remedy)))
