"""Replacements for the variable functions of `tensorflow.python.eager.tape`.

Each does what TensorFlow's function of the same name does, with the
variables resolved by `tfdtape.resolution.resolve` instead of TensorFlow's
own resolver hook (`tape._variables_override`), so the commit's semantics hold
whether or not that hook is registered.
"""

from tensorflow.python import pywrap_tfe

from tfdtape import resolution
from tfdtape import tracing

_tape_watch_variable = pywrap_tfe.TFE_Py_TapeWatchVariable
_tape_variable_accessed = pywrap_tfe.TFE_Py_TapeVariableAccessed
_watcher_variable_accessed = pywrap_tfe.TFE_Py_VariableWatcherVariableAccessed
_resolve = resolution.resolve


def watch_variable(tape, variable):
    """Marks `variable`, as resolved in the current context, watched by `tape`."""
    watched = _resolve(variable)
    if tracing.active:
        tracing.record("watch", variable, watched)
    for var in watched:
        _tape_watch_variable(tape._tape, var)  # pylint: disable=protected-access
        _watcher_variable_accessed(var)


def variable_accessed(variable):
    """Notifies every tape and variable watcher that `variable` was read.

    The variables notified are `variable` resolved in the current context.
    """
    accessed = _resolve(variable)
    if tracing.active:
        tracing.record("access", variable, accessed)
    for var in accessed:
        _tape_variable_accessed(var)
        _watcher_variable_accessed(var)


def variables_accessed(variables):
    """Like `variable_accessed` for each trainable item of `variables`.

    Every item is resolved before any is notified, so a bad item notifies
    nothing.
    """
    decisions = [(variable, _resolve(variable)) for variable in variables
                 if variable.trainable]
    for variable, accessed in decisions:
        if tracing.active:
            tracing.record("access", variable, accessed)
        for var in accessed:
            _tape_variable_accessed(var)
            _watcher_variable_accessed(var)
