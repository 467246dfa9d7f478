"""Replacements for `tf.GradientTape.watch` and `tf.GradientTape.gradient`.

TensorFlow's own versions touch `DistributedVariable.handle`, which raises
outside replica context, so in cross-replica context a distributed variable
can be neither watched nor differentiated. These versions make both work:
`watch` hands the variable to `tape.watch_variable`, which resolves it to its
components, and `gradient` differentiates with respect to those components
and returns their total. In replica context, and with no strategy, both behave
as TensorFlow's do, except that a gradient taken with no strategy from a tape
that recorded the replicas of a `strategy.run` is that total too
(`tfdtape.spanning_tapes`), and `watched_variables` lists each variable
once. `watch` is wrapped in TensorFlow's `filter_traceback`,
so its refusals show the user's frames, not tfdtape's
(`tfdtape.frame_filters`); `gradient` is not, since AutoGraph maps an error
inside a `tf.function` back to the user's line through the frames it
leaves in place.
"""

import contextlib
import dataclasses
import functools
import sys

from tensorflow.python.distribute import values as values_lib
from tensorflow.python.distribute import values_util
from tensorflow.python.eager import backprop_util
from tensorflow.python.eager import tape as tape_module
from tensorflow.python.framework import composite_tensor
from tensorflow.python.framework import type_spec
from tensorflow.python.ops import default_gradient
from tensorflow.python.ops.unconnected_gradients import UnconnectedGradients
from tensorflow.python.platform import tf_logging as logging
from tensorflow.python.util import _pywrap_utils
from tensorflow.python.util import nest
from tensorflow.python.util import traceback_utils

from tfdtape import backward_placement
from tfdtape import boundary
from tfdtape import call_sites
from tfdtape import compat
from tfdtape import component_totals
from tfdtape import cross_replica_reads
from tfdtape import cross_thread_watch
from tfdtape import errors
from tfdtape import events
from tfdtape import keras_variables
from tfdtape import on_read_sources
from tfdtape import resolution
from tfdtape import spanning_tapes
from tfdtape import worker_totals
from tfdtape import workers

_WATCH_SYMBOL = "tf.GradientTape.watch"
_GRADIENT_SYMBOL = "tf.GradientTape.gradient"


@traceback_utils.filter_traceback
def watch(self, tensor):
    """Ensures that `tensor` (a tensor, variable or nested structure) is traced.

    Variables are watched as `tfdtape.resolve` resolves them: the container
    in replica context, every local component of a distributed variable in
    cross-replica context. A Keras 3 variable is watched as the `tf.Variable`
    it wraps (stock TensorFlow refuses it). Composite tensors, `PerReplica`
    values among them, are split into their component tensors, as stock
    TensorFlow does. Everything in `tensor` is checked and resolved before
    anything is watched. A tape that records in another thread watches
    `tensor` too, where TensorFlow would do nothing
    (`tfdtape.cross_thread_watch`).

    Raises:
        tfdtape.errors.NotWatchableError: a ValueError (as TensorFlow raises)
            and TypeError, when `tensor` holds something that is neither a
            tensor nor a variable, or a distributed variable of another
            strategy; nothing is watched then.
        ValueError: the watch, from a thread the tape does not record in,
            would hold for one trace of a tf.function only
            (`tfdtape.cross_thread_watch.check_lasting`).
    """
    items = [(item, watched, _is_variable(item))
             for item, watched in _watchables(tensor)]
    if len(items) > 1:  # One variable raises before it is watched anyway.
        for item, _, is_variable in items:
            if is_variable:
                resolution.resolve(item)  # Raises before anything is watched.
    visiting = cross_thread_watch.is_visiting(self)
    if visiting:
        cross_thread_watch.check_lasting(
            self, [item for item, _, is_variable in items if is_variable])
        tape_module.push_tape(self._tape)
    try:
        for item, watched, is_variable in items:
            if not backprop_util.IsTrainable(watched):
                logging.log_first_n(  # TensorFlow's own words, as stock warns
                    logging.WARN, "The dtype of the watched tensor must be "
                    "floating (e.g. tf.float32), got %r", 5, watched.dtype)
            if is_variable:
                tape_module.watch_variable(self._tape, item)
            else:
                tape_module.watch(self._tape, item)
    finally:
        if visiting:
            tape_module.pop_tape(self._tape)


def _is_variable(item):
    """True for what the tape watches through a variable's handle."""
    return (resolution.is_distributed_variable(item) or
            keras_variables.is_keras_variable(item) or hasattr(item, "handle"))


def _watchables(structure):
    """The tensors and variables in `structure`, composites split into parts.

    Returns:
        (item, watched) pairs: `item` as found (a Keras 3 variable stays one,
        so traces name its path), `watched` the tensor or tf.Variable it is.
    """
    found = []
    for item in nest.flatten(structure):
        inner = keras_variables.wrapped_variable(item, _WATCH_SYMBOL)
        if inner is not None:
            found.append((item, inner))
        elif _pywrap_utils.IsTensor(item) or _pywrap_utils.IsVariable(item):
            found.append((item, item))
        elif isinstance(item, composite_tensor.CompositeTensor):
            parts = type_spec.type_spec_from_value(item)._to_components(item)
            found.extend(_watchables(parts))
        else:
            resolution.check_watchable(item, _WATCH_SYMBOL)
            raise events.refused(errors.NotWatchableError(errors.message(
                "cannot watch this object", _WATCH_SYMBOL,
                "a tf.Tensor, tf.Variable or ExtensionType",
                f"an object of type {type(item).__name__}",
                "Pass tensors or variables to GradientTape.watch")))
    return found


def make_gradient(original_gradient):
    """Returns a `GradientTape.gradient` that also accepts distributed sources.

    A `PerReplica` target stands for the sum of its replicas' values (with
    no `output_gradients`). In cross-replica context, and with no strategy
    from a tape that
    recorded the replicas of a strategy.run, a source that is an ON_WRITE
    distributed variable (such as a `MirroredVariable`), or a Keras 3
    variable wrapping one, gets the total derivative: the sum of the
    gradients with respect to its local components. Everything else goes to
    `original_gradient` unchanged.

    An ON_READ source outside any strategy gets the derivative with
    respect to its aggregate where it has one (`tfdtape.on_read_sources`).

    A source of a strategy of several workers (MultiWorkerMirroredStrategy)
    gets the total across the workers (`tfdtape.worker_totals`).

    Raises:
        ValueError: such a source is ON_READ in cross-replica context, or
            outside any strategy with no one derivative; or its total
            across workers cannot be exact (`tfdtape.worker_totals`).
    """

    @functools.wraps(original_gradient)
    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=UnconnectedGradients.NONE):
        recorded = self._tape  # A non-persistent gradient drops it.
        spanning = spanning_tapes.spanned_runs(self) > 0
        try:
            with (backward_placement.placing() if spanning
                  else contextlib.nullcontext()), (
                    spanning_tapes.differentiating_replicas() if spanning
                    else contextlib.nullcontext()):
                outcome = _differentiate(
                    original_gradient, self, target, sources, output_gradients,
                    unconnected_gradients)
        except Exception as error:
            if spanning and spanning_tapes.is_cross_replica_backward_error(error):
                errors.extend_message(error, spanning_tapes.BACKWARD_NOTE)
            raise
        events.note_totals(outcome.totals, outcome.summing)
        if events.active:
            _report(self, recorded, sources, outcome.gradients, outcome,
                    sys._getframe(1))
        return outcome.gradients

    return gradient


@dataclasses.dataclass(frozen=True)
class _Outcome:
    """What one `tape.gradient` call computed.

    Attributes:
        gradients: what `gradient` returns, packed as the sources.
        totals: (source, number of components) for each distributed source
            whose total derivative over its components was summed (not those
            that came back None; with no strategy, only those a component
            beyond the first took part in: the others get TensorFlow's own
            gradient).
        one_device: every such total in cross-replica context came from one
            component of several (the step ran on one device, as without
            strategy.run).
        summing: the sources' components were differentiated (outside
            replica context) rather than the sources themselves.
        workers: across how many workers the totals were all-reduced (1:
            within this process).
    """
    gradients: object
    totals: tuple[tuple[object, int], ...] = ()
    one_device: bool = False
    summing: bool = False
    workers: int = 1


def _differentiate(original_gradient, tape, target, sources, output_gradients,
                   unconnected_gradients):
    """The `_Outcome` of differentiating `target` by `sources` on `tape`."""
    if output_gradients is None:
        target = nest.map_structure(_replicas_if_per_replica, target)
    flat_sources = nest.flatten(sources)
    cross_replica = values_util.get_current_replica_id_as_int() is None
    if not (any(map(_is_distributed_source, flat_sources)) and
            _outside_replica_context(cross_replica)):
        if _asks_for_zeros(unconnected_gradients):
            # TensorFlow builds the zeros of a Keras 3 source from its dtype,
            # a string there: it gets those of the tf.Variable it wraps.
            sources = nest.pack_sequence_as(sources, [
                keras_variables.unwrap(source, _GRADIENT_SYMBOL)
                for source in flat_sources])
        return _Outcome(original_gradient(
            tape, target, sources, output_gradients=output_gradients,
            unconnected_gradients=unconnected_gradients))
    with boundary.translated("differentiating distributed sources by their "
                             "components", _GRADIENT_SYMBOL):
        flat_variables = [keras_variables.unwrap(source, _GRADIENT_SYMBOL)
                          for source in flat_sources]
        components, spans = _split_distributed_sources(flat_variables, cross_replica)
        across_workers = [variable for variable in flat_variables
                          if workers.of_several_workers(variable)]
        anchors = {}  # id(variable) -> the anchor its reads outside the replicas came through
        if across_workers:
            worker_totals.check_may_reduce(tape, across_workers)
            for variable in across_workers:
                anchor = cross_replica_reads.anchor_of(tape, variable)
                if anchor is not None:
                    anchors[id(variable)] = anchor
        # With no strategy, zeros for what is unconnected are filled in as
        # TensorFlow fills them, after the sum: a zero for an unconnected
        # component would count as taking part, and turn TensorFlow's own
        # gradient of the first component into a sum (-0.0 into +0.0,
        # IndexedSlices into a dense tensor); across workers, after the
        # all-reduce, which decides what took part on any worker.
        fill_zeros = ((not cross_replica or across_workers) and
                      _asks_for_zeros(unconnected_gradients))
    flat_gradients = original_gradient(
        tape, target, components + list(anchors.values()),
        output_gradients=output_gradients,
        unconnected_gradients=(UnconnectedGradients.NONE if fill_zeros
                               else unconnected_gradients))
    with boundary.translated("totalling the gradients of distributed sources",
                             _GRADIENT_SYMBOL):
        outside = dict(zip(anchors, flat_gradients[len(components):]))
        totals = _totals(flat_variables, [flat_gradients[start:stop]
                                          for start, stop in spans], cross_replica,
                         outside)
        # Per distributed source: (source, components, how many took part,
        # whether its total counts as summed: in cross-replica context where
        # any component took part; outside any strategy where one beyond the
        # first did (TensorFlow's own gradient is the first's); across workers
        # where any worker's did, which its total says).
        distributed = [
            (source, stop - start, sum(g is not None for g in flat_gradients[start:stop]),
             (total is not None if workers.of_several_workers(variable) else
              any(g is not None for g in flat_gradients[
                  (start if cross_replica else start + 1):stop])))
            for source, variable, (start, stop), total in zip(
                flat_sources, flat_variables, spans, totals)
            if resolution.is_distributed_variable(variable)]
        summed = tuple((source, components)
                       for source, components, _, counted in distributed if counted)
        # One component of several: a strategy of one replica has nothing else.
        of_several = [count for _, components, count, _ in distributed if components > 1]
        one_device = (cross_replica and bool(summed) and bool(of_several) and
                      all(count <= 1 for count in of_several))
        if fill_zeros:
            totals = [default_gradient.zeros_like(variable) if total is None else total
                      for variable, total in zip(flat_variables, totals)]
        worker_count = max([variable.distribute_strategy.extended._num_workers
                            for variable in across_workers], default=1)
        if cross_replica:
            component_totals.note_over_replicas(
                total for variable, total in zip(flat_variables, totals)
                if resolution.is_distributed_variable(variable))
        return _Outcome(nest.pack_sequence_as(sources, totals), summed, one_device,
                        summing=True, workers=worker_count)


def _replicas_if_per_replica(target):
    """A `PerReplica` target as the list of its replicas' values (the
    gradient of several targets is that of their sum; TensorFlow refuses a
    PerReplica there); any other target as itself."""
    if isinstance(target, values_lib.PerReplica):
        return list(target.values)
    return target


def _asks_for_zeros(unconnected_gradients):
    """Whether `unconnected_gradients` asks for zeros (an invalid value is
    left to TensorFlow, which names it)."""
    return unconnected_gradients in (UnconnectedGradients.ZERO,
                                     UnconnectedGradients.ZERO.value)


def _outside_replica_context(cross_replica):
    """Whether a distributed source gets its total derivative over its
    components: in cross-replica context, and with no strategy at all (where
    TensorFlow would let the variable stand for its first component, and a
    tape that recorded the replicas of a strategy.run, or a tf.function that
    ran one, would get replica 0's share alone)."""
    return cross_replica or not compat.strategy_context.has_strategy()


def _report(tape, recorded, sources, result, outcome, frame):
    """Sends a GradientEvent for this call to the open sinks."""
    flat_sources = tuple(nest.flatten(sources))
    events.record_gradient(events.GradientEvent(
        tape, recorded, flat_sources, tuple(nest.flatten(result)), outcome.summing,
        outcome.totals, call_sites.caller_location(frame), events.context_now(),
        outcome.one_device, flat_sources, spanning_tapes.spanned_runs(tape) > 0,
        outcome.workers))


def make_watched_variables(original_watched_variables):
    """Returns a `GradientTape.watched_variables` that lists each variable
    once.

    TensorFlow keys what a tape watched by the handle it was watched through.
    A tape that recorded the replicas of a strategy.run watched a distributed
    variable through each replica's component handle, so TensorFlow would
    list it once per replica (and applying gradients to that list would
    update it as often); a watch in cross-replica context watched all its
    components, listed as the variable itself too. Where nothing changes,
    TensorFlow's own tuple is returned.
    """

    @functools.wraps(original_watched_variables)
    def watched_variables(self):
        watched = original_watched_variables(self)
        listed = _containers_for_full_sets(watched)
        seen = set()
        unique = tuple(variable for variable in listed
                       if not (id(variable) in seen or seen.add(id(variable))))
        same = len(unique) == len(watched) and all(
            mine is theirs for mine, theirs in zip(unique, watched))
        return watched if same else unique

    return watched_variables


def _containers_for_full_sets(watched):
    """`watched` with the components of a distributed variable replaced by
    the variable where all its local components are there (a watch in
    cross-replica context): a gradient with respect to it, and an update of
    it, then reach every copy, where updating the components one by one
    with their own gradients would let the copies drift apart."""
    containers = {}
    for variable in watched:
        container = resolution.container_of(variable)
        if container is not None:
            containers.setdefault(id(container), (container, set()))[1].add(id(variable))
    full = {key for key, (container, found) in containers.items()
            if {id(c) for c in container.values} <= found}
    if not full:
        return watched
    listed = []
    for variable in watched:
        container = resolution.container_of(variable)
        if container is not None and id(container) in full:
            listed.append(container)
        else:
            listed.append(variable)
    return listed


def make_push_tape(original_push_tape):
    """Returns a `GradientTape._push_tape` that reports to `replica_recording`."""

    @functools.wraps(original_push_tape)
    def _push_tape(self):
        is_new = self._tape is None
        original_push_tape(self)
        if is_new:
            cross_replica_reads.forget(self)
        spanning_tapes.tape_pushed(self, is_new)

    return _push_tape


def make_pop_tape(original_pop_tape):
    """Returns a `GradientTape._pop_tape` that reports to `replica_recording`."""

    @functools.wraps(original_pop_tape)
    def _pop_tape(self):
        original_pop_tape(self)
        spanning_tapes.tape_popped(self)

    return _pop_tape


def _is_distributed_source(source):
    """True for a distributed variable, or a Keras 3 variable wrapping one."""
    if resolution.is_distributed_variable(source):
        return True
    return resolution.is_distributed_variable(
        keras_variables.inner_or_none(source))


def _split_distributed_sources(flat_sources, cross_replica):
    """Replaces each distributed source by its local components: in
    cross-replica context as the current strategy gives them; with no
    strategy as the variable's own gives them.

    Returns:
        (components, spans): the flat list to differentiate, and for each
        original source the (start, stop) slice of `components` it became.

    Raises:
        ValueError: in cross-replica context, a source is an ON_READ
            (SyncOnRead) variable, whose components do not add up to one
            value.
    """
    current = compat.strategy_context.get_strategy() if cross_replica else None
    components, spans = [], []
    for source in flat_sources:
        start = len(components)
        if resolution.is_distributed_variable(source):
            if cross_replica and on_read_sources.is_on_read(source):
                raise on_read_sources.refusal(
                    source, on_read_sources.CROSS_REPLICA,
                    "whose replicas hold different values")
            strategy = current or source.distribute_strategy
            components.extend(strategy.experimental_local_results(source))
        else:
            components.append(source)
        spans.append((start, len(components)))
    return components, spans


def _totals(variables, gradients, cross_replica, outside):
    """Each source's gradient from its components' `gradients`: the total
    over them (through the strategy's reduction where
    `tfdtape.component_totals` can), across the workers of a strategy of
    several (`tfdtape.worker_totals`, with `outside`: {id(variable): what
    its reads outside the replicas contributed}), or outside any strategy
    for an ON_READ variable the derivative of its aggregate (in
    cross-replica context such a source was refused before)."""
    totals = [None] * len(variables)
    reducible = []
    across_workers = {}  # id(strategy) -> (strategy, [index])
    for index, (variable, parts) in enumerate(zip(variables, gradients)):
        if not resolution.is_distributed_variable(variable):
            totals[index] = component_totals.sum_components(parts)
        elif workers.of_several_workers(variable):
            strategy = variable.distribute_strategy
            across_workers.setdefault(id(strategy), (strategy, []))[1].append(index)
        elif not cross_replica and on_read_sources.is_on_read(variable):
            totals[index] = on_read_sources.derivative(variable, parts)
        elif component_totals.reducible(variable, parts):
            reducible.append(index)
        else:
            totals[index] = component_totals.sum_components(parts)
    reduced = component_totals.reduce([(variables[index], gradients[index])
                                       for index in reducible])
    for index, total in zip(reducible, reduced):
        totals[index] = total
    for strategy, indices in across_workers.values():
        reduced = worker_totals.reduce(strategy, [
            worker_totals.Source(variables[index], tuple(gradients[index]),
                                 outside.get(id(variables[index])))
            for index in indices])
        for index, total in zip(indices, reduced):
            totals[index] = total
    return totals
