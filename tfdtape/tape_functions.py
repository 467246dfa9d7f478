"""Replacements for the variable functions of `tensorflow.python.eager.tape`.

Each does what TensorFlow's function of the same name does, with the
variables resolved by `tfdtape.resolution.resolve` instead of TensorFlow's
own resolver hook (`tape._variables_override`), so the commit's semantics hold
whether or not that hook is registered.
"""

from tensorflow.python import pywrap_tfe

from tfdtape import resolution

_tape_watch_variable = pywrap_tfe.TFE_Py_TapeWatchVariable
_tape_variable_accessed = pywrap_tfe.TFE_Py_TapeVariableAccessed
_watcher_variable_accessed = pywrap_tfe.TFE_Py_VariableWatcherVariableAccessed
_resolve = resolution.resolve


def watch_variable(tape, variable):
    """Marks `variable`, as resolved in the current context, watched by `tape`."""
    for var in _resolve(variable):
        _tape_watch_variable(tape._tape, var)  # pylint: disable=protected-access
        _watcher_variable_accessed(var)


def variable_accessed(variable):
    """Notifies every tape and variable watcher that `variable` was read.

    The variables notified are `variable` resolved in the current context.
    """
    for var in _resolve(variable):
        _tape_variable_accessed(var)
        _watcher_variable_accessed(var)


def variables_accessed(variables):
    """Like `variable_accessed` for each trainable item of `variables`.

    Every item is resolved before any is notified, so a bad item notifies
    nothing.
    """
    accessed = [var for variable in variables if variable.trainable
                for var in _resolve(variable)]
    for var in accessed:
        _tape_variable_accessed(var)
        _watcher_variable_accessed(var)
