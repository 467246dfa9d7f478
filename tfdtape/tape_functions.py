"""Replacements for the variable functions of `tensorflow.python.eager.tape`.

Each does what TensorFlow's function of the same name does, with the
variables resolved by `tfdtape.resolution.resolve` instead of TensorFlow's
own resolver hook (`tape._variables_override`), so the commit's semantics hold
whether or not that hook is registered. A decision is traced only after the
tape took it.

A component of a multi-worker variable read as itself (outside replica
context) is noted for `tfdtape.cross_replica_reads`.

Outside any strategy, `watch_variable` of a distributed variable also
watches the handles of all its local components (as tensors, so the tape
still lists the variable once): TensorFlow watches it through its first
component's handle alone, and a tape that does not watch what it reads
would then miss every other replica's share of a `strategy.run` it records,
or of a `tf.function` that runs one.
"""

from tensorflow.python import pywrap_tfe
from tensorflow.python.framework import ops

from tfdtape import cross_replica_reads
from tfdtape import events
from tfdtape import resolution

_tape_watch = pywrap_tfe.TFE_Py_TapeWatch
_tape_watch_variable = pywrap_tfe.TFE_Py_TapeWatchVariable
_tape_variable_accessed = pywrap_tfe.TFE_Py_TapeVariableAccessed
_watcher_variable_accessed = pywrap_tfe.TFE_Py_VariableWatcherVariableAccessed
_resolve = resolution.resolve
_get_default_graph = ops.get_default_graph
_ResourceVariable = resolution.RESOURCE_VARIABLE
_CONTAINER_REFERENCE = resolution.CONTAINER_REFERENCE
_AGGREGATING_REFERENCE = resolution.AGGREGATING_REFERENCE


def watch_variable(tape, variable):
    """Marks `variable`, as resolved in the current context, watched by `tape`
    (outside any strategy, a distributed variable through every local
    component's handle)."""
    watched = _resolve(variable)
    for var in watched:
        _tape_watch_variable(tape._tape, var)
        _watcher_variable_accessed(var)
    if (len(watched) == 1 and resolution.is_distributed_variable(watched[0]) and
            not _get_default_graph()._distribution_strategy_stack):
        for component in watched[0].values:
            _tape_watch(tape._tape, component.handle)
    if events.active:
        events.record("watch", variable, watched)


def variable_accessed(variable):
    """Notifies every tape and variable watcher that `variable` was read.

    The variables notified are `variable` resolved in the current context.
    """
    # Every eager read of a trainable variable lands here, and most are of
    # plain ResourceVariables, which resolve to themselves: `resolve`'s first
    # test, inlined, skips the call, the tuple and the loop for them.
    if (type(variable) is _ResourceVariable and
            _CONTAINER_REFERENCE not in variable._handle.__dict__ and
            _AGGREGATING_REFERENCE not in variable.__dict__):
        _tape_variable_accessed(variable)
        _watcher_variable_accessed(variable)
        if events.active:
            events.record("access", variable, (variable,))
        return
    accessed = _resolve(variable)
    for var in accessed:
        _tape_variable_accessed(var)
        _watcher_variable_accessed(var)
    if accessed[0] is variable:  # A component read as itself: outside the replicas.
        cross_replica_reads.note_direct_read(variable)
    if events.active:
        events.record("access", variable, accessed)


def variables_accessed(variables):
    """Like `variable_accessed` for each trainable item of `variables`.

    Every item is resolved before any is notified, so a bad item notifies
    nothing.
    """
    decisions = [(variable, _resolve(variable)) for variable in variables
                 if variable.trainable]
    for variable, accessed in decisions:
        for var in accessed:
            _tape_variable_accessed(var)
            _watcher_variable_accessed(var)
        if accessed[0] is variable:
            cross_replica_reads.note_direct_read(variable)
        if events.active:
            events.record("access", variable, accessed)
