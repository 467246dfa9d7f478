"""What no tape recorded: the replicas of an eager `strategy.run`.

MirroredStrategy (and MultiWorkerMirroredStrategy) runs each replica
function of an eager `strategy.run` in a thread of its own, and a gradient
tape records only the operations of the thread it was opened in. A tape that
records while its own thread calls an eager `strategy.run` therefore records
nothing the replicas compute — whether they read a distributed variable or
a tensor computed from one — and a gradient through them would silently come
out None, or partial.

tfdtape marks every tape recording in the calling thread (outside replica
context) when an eager `strategy.run` starts there, and `check` refuses a
cross-replica gradient with respect to a distributed variable from a marked
tape. Inside a `tf.function` the replicas are traced into the function, whose
call the tape records, so nothing is marked. A `strategy.run` in another
thread marks nothing here.
"""

import threading

from tensorflow.python.eager import context
from tensorflow.python.eager import def_function
from tensorflow.python.framework import ops

from tfdtape import errors
from tfdtape import keras_variables
from tfdtape import resolution

_MISSED_RUN = "_tfdtape_missed_strategy_run"  # On a GradientTape: True.

# Kept across importlib.reload: the tapes already recording stay known.
_recording = globals().get("_recording") or threading.local()
"""Per thread, `.tapes`: the GradientTapes recording there now (pushed
outside replica context)."""


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
    stack = ops.get_default_graph()._distribution_strategy_stack  # pylint: disable=protected-access
    if stack and stack[-1].replica_context is not None:
        return
    _tapes_here().append(tape)


def tape_popped(tape):
    """Notes that `tape` (a GradientTape) stopped recording in this thread."""
    tapes = _tapes_here()
    for index, recording in enumerate(tapes):
        if recording is tape:
            del tapes[index]
            return


def make_call_for_each_replica(original):
    """Returns a `mirrored_run.call_for_each_replica` that marks the tapes
    recording in the calling thread when the replicas run eagerly."""

    def call_for_each_replica(strategy, fn, args=None, kwargs=None):
        if (context.executing_eagerly() and
                not isinstance(fn, def_function.Function)):
            for tape in _tapes_here():
                tape.__dict__[_MISSED_RUN] = True
        return original(strategy, fn, args, kwargs)

    call_for_each_replica.__doc__ = original.__doc__
    call_for_each_replica.__wrapped__ = original
    return call_for_each_replica


def check(tape, sources, symbol):
    """Raises if `tape` recorded an eager `strategy.run` and `sources` hold a
    distributed variable (or a Keras variable wrapping one).

    Args:
        tape: the GradientTape a cross-replica gradient is taken from.
        sources: the gradient's flat sources, as the user passed them.
        symbol: the API the user called, named in the message.

    Raises:
        ValueError: the tape cannot have recorded what the replicas of that
            `strategy.run` computed.
    """
    if not tape.__dict__.get(_MISSED_RUN):
        return
    for source in sources:
        if resolution.is_distributed_variable(
                keras_variables.unwrap(source, symbol)):
            raise ValueError(errors.message(
                "cannot take a cross-replica gradient through an eager "
                "strategy.run", symbol,
                "a tape that recorded everything between "
                f"{keras_variables.label(source)!r} and the target",
                "a tape that was recording when an eager strategy.run ran "
                "its replicas in threads the tape does not record, so the "
                "gradient would be missing (None or partial)",
                "Open the tape and take the gradient inside the function you "
                "pass to strategy.run, or run the whole step (strategy.run "
                "included) in a tf.function"))
