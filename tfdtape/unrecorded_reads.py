"""Reads no tape recorded: distributed variables read by eager `strategy.run`.

MirroredStrategy runs each replica function of an eager `strategy.run` in a
thread of its own, and a gradient tape records only the operations of the
thread it was opened in. A tape opened in cross-replica context around an
eager `strategy.run` therefore records nothing the replicas compute, and a
gradient taken through them would silently come out None (or partial).

tfdtape notes every such read: a distributed variable read eagerly in replica
context while a tape opened outside replica context records in another
thread. Each such tape keeps the
variable's id; `check` then refuses a cross-replica gradient with respect to
a variable whose reads the tape missed. Nothing is noted for reads inside a
`tf.function`: calling the function marks its variables as read in the
caller's thread, where the tape is.
"""

import threading
import weakref

from tensorflow.python.framework import ops

from tfdtape import errors
from tfdtape import keras_variables

_MISSED = "_tfdtape_unrecorded_reads"  # Per GradientTape: ids of variables.
_lock = threading.Lock()
recording = {}
"""id(GradientTape) -> (weak reference to it, ident of the thread it records
in), for every tape recording now. Read without the lock on the hot path."""


def tape_pushed(tape, is_new):
    """Notes that `tape` (a GradientTape) records in this thread from now on.

    A tape that starts recording in the replica context of a strategy (inside
    `strategy.run`) records every read of its replica, so it is not noted:
    in the usual program, a tape per replica, nothing is, and reads cost
    nothing extra.

    Args:
        tape: the GradientTape.
        is_new: True when it starts on a fresh tape (first use or reset()),
            which forgets the reads it missed before.
    """
    if is_new:
        tape.__dict__.pop(_MISSED, None)
    stack = ops.get_default_graph()._distribution_strategy_stack  # pylint: disable=protected-access
    if stack and stack[-1].replica_context is not None:
        return
    with _lock:
        recording[id(tape)] = (weakref.ref(tape), threading.get_ident())


def tape_popped(tape):
    """Notes that `tape` (a GradientTape) stopped recording."""
    with _lock:
        recording.pop(id(tape), None)


def note_replica_read(container):
    """Tells every tape recording in another thread that `container` was read
    where it could not see. Called for eager replica-context reads."""
    here = threading.get_ident()
    with _lock:
        entries = list(recording.items())
    for key, (reference, thread) in entries:
        tape = reference()
        if tape is None:
            with _lock:
                if recording.get(key, (None,))[0] is reference:
                    del recording[key]
        elif thread != here:
            tape.__dict__.setdefault(_MISSED, set()).add(id(container))


def check(tape, sources, symbol):
    """Raises if `tape` missed reads of a distributed variable in `sources`.

    Args:
        tape: the GradientTape a gradient is taken from.
        sources: the gradient's flat sources, as the user passed them (a
            Keras variable is checked as the tf.Variable it wraps, and named
            by its path).
        symbol: the API the user called, named in the message.

    Raises:
        ValueError: a source was read inside an eager `strategy.run` while
            `tape` recorded in another thread.
    """
    missed = tape.__dict__.get(_MISSED)
    if not missed:
        return
    for source in sources:
        if id(keras_variables.unwrap(source, symbol)) in missed:
            raise ValueError(errors.message(
                f"the tape did not record the reads of "
                f"{keras_variables.label(source)!r} inside strategy.run",
                symbol, "a tape that recorded every read of the variable",
                "reads in the replica threads of an eager strategy.run, which "
                "a tape opened outside strategy.run does not record, so its "
                "gradient would be missing (None or partial)",
                "Open the tape and take the gradient inside the function you "
                "pass to strategy.run, or run the whole step (strategy.run "
                "included) in a tf.function"))
