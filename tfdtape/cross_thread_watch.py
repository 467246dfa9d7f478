"""`tape.watch` from a thread where the tape does not record.

TensorFlow's watch does nothing in a thread where no tape records. A tape
recording in one thread is asked to watch from another when the replicas of
a `tf.function` passed to `strategy.run` run (MirroredStrategy runs them in
threads of their own, which a tape outside that function does not record),
or from a thread of the user's. tfdtape lets the tape watch there too, by
pushing it on that thread for the duration of the watch.

While a `tf.function` is traced in such a thread, though, the watch is a
Python side effect of the trace: it runs on the first call alone, and later
calls, reusing the trace, would watch nothing. Where that watch is the only
way the tape would see a variable (a tape created with
`watch_accessed_variables=False` that has not watched it already), it is
refused with one clear error instead of a silent None from the second step
on.
"""

from tensorflow.python import pywrap_tfe
from tensorflow.python.eager import context

from tfdtape import errors
from tfdtape import events
from tfdtape import resolution

_SYMBOL = "tf.GradientTape.watch"


def is_visiting(tape):
    """Whether `tape` (a GradientTape) records, but not in this thread (no
    tape does, and recording is not stopped here)."""
    return (tape._recording and pywrap_tfe.TFE_Py_TapeSetIsEmpty() and
            not pywrap_tfe.TFE_Py_TapeSetIsStopped())


def check_lasting(tape, variables):
    """Raises ValueError if watching `variables` (tf.Variables, Keras
    variables) on `tape`, which is visiting this thread, would hold for this
    trace of a tf.function only.

    Eagerly, and for variables the tape watches anyway (it watches what it
    reads, or it watched them already), there is nothing to refuse.
    """
    if context.executing_eagerly() or tape._watch_accessed_variables:
        return
    watched = {id(variable) for variable in resolution.watched_by(tape)}
    for variable in variables:
        resolved = resolution.resolve(variable)
        if not all(id(item) in watched for item in resolved):
            raise events.refused(ValueError(errors.message(
                f"cannot watch {getattr(variable, 'name', variable)!r} inside this "
                "tf.function", _SYMBOL,
                "a tape that records where the tf.function is traced, or a "
                "variable the tape watches anyway",
                "a tape created with watch_accessed_variables=False that "
                "records outside the function (the replicas of a tf.function "
                "passed to strategy.run run in threads of their own): the "
                "watch would run while the function is traced, and later calls "
                "would give None",
                "Call tape.watch before strategy.run, or create the tape with "
                "watch_accessed_variables=True")))
