"""Reads of a multi-worker variable outside the replicas, kept apart on the tape.

Under a strategy of several workers (MultiWorkerMirroredStrategy) the
gradient of a distributed variable outside replica context is all-reduced
across the workers (`tfdtape.worker_totals`): each worker adds what its
replicas contributed. A term computed outside the replicas (an L2 penalty
on the variable added to the reduced loss) is computed alike on every
worker, and all-reduced with the rest it would count once per worker. So,
while a tape records in this thread, a read of such a variable in
cross-replica context through `MirroredVariable._get_cross_replica` (what
`tf.convert_to_tensor`, arithmetic, `read_value`, `numpy` and a Keras 3
variable's conversion reach) is recorded apart: the read runs with
recording stopped, and its value is recorded as an identity of an anchor
tensor of the variable's own, one per tape and graph, which the tape
watches. The gradient with respect to the anchor (`anchor_of`) is what the
terms outside the replicas contributed. A tape that watches only what it
is told to (`watch_accessed_variables=False`) gets an anchor only for a
variable it watches.

A read of a component itself outside replica context (`v.value()`; a
read outside any strategy scope, where a MirroredVariable stands for its
first component; any read inside a `tf.cond` branch or loop body, where no
anchor can be used from outside) lands on the component's handle together
with the replicas' share. `note_direct_read` marks the variable on the tapes
recording then, and `worker_totals` refuses its gradient.
"""

import functools

from tensorflow.python import pywrap_tfe
from tensorflow.python.eager import tape as tape_module
from tensorflow.python.framework import ops
from tensorflow.python.ops import array_ops

from tfdtape import compat
from tfdtape import graph_scopes
from tfdtape import resolution
from tfdtape import spanning_tapes
from tfdtape import workers

READ = "tfdtape_cross_replica_read"
"""The name the recorded read carries on the tape."""
_ANCHORS = "_tfdtape_cross_replica_anchors"
"""On a GradientTape: {(id(variable), id(graph)): (variable, anchor)}."""
_DIRECT_READS = "_tfdtape_direct_reads"
"""On a GradientTape: {id(variable): the route of its first read by
another route}."""


def make_get_cross_replica(original):
    """Returns a `MirroredVariable._get_cross_replica` that records the read
    apart (as described above) under a strategy of several workers while a
    tape records in this thread."""

    @functools.wraps(original)
    def _get_cross_replica(self):
        tapes = _tapes_apart(self)
        if not tapes:
            return original(self)
        with compat.stop_recording():
            value = original(self)
        anchors = [_anchor(tape, self, value) for tape in tapes]
        compat.recording_module.record_operation(
            READ, [value], anchors, lambda gradient: [gradient] * len(anchors))
        return value

    return _get_cross_replica


def _tapes_apart(variable):
    """The tapes recording here that a read of `variable` is recorded apart
    for: none unless it is a multi-worker variable read outside control-flow
    bodies; then those that watch what they read, or watch `variable`."""
    if (pywrap_tfe.TFE_Py_TapeSetIsEmpty() or
            not workers.in_multi_worker_mode(variable._distribute_strategy) or
            graph_scopes.in_control_flow_body(ops.get_default_graph())):
        return []
    tapes = []
    for tape in spanning_tapes.recording_tapes_here():
        if tape._watch_accessed_variables or any(
                resolution.container_of(watched) is variable
                for watched in resolution.watched_by(tape)):
            tapes.append(tape)
    return tapes


def _anchor(tape, variable, value):
    """`tape`'s anchor for `variable` in the current graph, made (and
    watched) at the first read."""
    anchors = tape.__dict__.setdefault(_ANCHORS, {})
    key = (id(variable), id(ops.get_default_graph()))
    found = anchors.get(key)
    if found is None:
        with compat.stop_recording():
            anchor = array_ops.zeros_like(value)
        tape_module.watch(tape._tape, anchor)
        found = anchors[key] = (variable, anchor)
    return found[1]


def anchor_of(tape, variable):
    """The anchor `tape` recorded reads of `variable` apart through in the
    current graph, or None."""
    found = tape.__dict__.get(_ANCHORS, {}).get(
        (id(variable), id(ops.get_default_graph())))
    return None if found is None else found[1]


def note_direct_read(component):
    """Marks the multi-worker variable `component` belongs to as read by
    another route on the tapes recording here (called for a component read
    outside replica context; a read recorded apart runs with recording
    stopped, and is not marked)."""
    variable = resolution.container_of(component)
    if (variable is None or pywrap_tfe.TFE_Py_TapeSetIsStopped() or
            not workers.in_multi_worker_mode(variable._distribute_strategy)):
        return
    graph = ops.get_default_graph()
    if not graph._distribution_strategy_stack:
        route = ("a read outside any strategy.scope(), where the variable "
                 "stands for its first component")
    elif graph_scopes.in_control_flow_body(graph):
        route = "a read inside a tf.cond branch or loop body"
    else:
        route = "a read of a component itself, as v.value() makes"
    for tape in spanning_tapes.recording_tapes_here():
        tape.__dict__.setdefault(_DIRECT_READS, {}).setdefault(id(variable), route)


def direct_read(tape, variable):
    """How `tape` recorded a read of `variable` by another route (the
    first), or None."""
    return tape.__dict__.get(_DIRECT_READS, {}).get(id(variable))


def forget(tape):
    """Forgets what `tape` recorded (it starts on a fresh tape)."""
    tape.__dict__.pop(_ANCHORS, None)
    tape.__dict__.pop(_DIRECT_READS, None)
