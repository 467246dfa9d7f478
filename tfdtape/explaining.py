"""`tfdtape.explain`: why did `tape.gradient` return None for a source?

Call `explain(tape, target, sources)` where you would call
`tape.gradient(target, sources)`: it computes the gradients the same way and,
for every source whose gradient is None, says why in plain words, from what
the tape watched, the source's kind, and the context the call is made in.
"""

import dataclasses
import threading
from typing import Any

from tensorflow.python import pywrap_tfe
from tensorflow.python.distribute import values_util
from tensorflow.python.util import _pywrap_utils
from tensorflow.python.util import nest

from tfdtape import errors
from tfdtape import events
from tfdtape import keras_variables
from tfdtape import resolution

NOT_WATCHED = "not watched"
"""A tensor no `tape.watch` call watched, or a variable the tape never
watched while created with `watch_accessed_variables=False`."""

NOT_READ = "not read while recording"
"""A trainable variable the tape (watching what it reads) never saw read."""

NOT_TRAINABLE = "not trainable"
"""A variable created with trainable=False, which a tape does not watch when
it is read, and which nothing watched explicitly."""

WATCHED_CONTAINER = "watched as the container"
"""A distributed variable's component, where the tape watched the container
(in replica context): the gradient belongs to the container."""

WRONG_CONTEXT = "gradient taken in the wrong context"
"""A distributed variable whose tape recorded in one context (replica or
cross-replica) while the gradient is taken in the other, which
differentiates with respect to what the other context watches."""

NOT_CONNECTED = "not connected to the target"
"""Watched (or, for a tensor, known to the tape), but the target does not
depend on it."""

REASONS = (NOT_WATCHED, NOT_TRAINABLE, NOT_READ, WATCHED_CONTAINER,
           WRONG_CONTEXT, NOT_CONNECTED)
"""Every reason `explain` gives, in the order it tests them."""


@dataclasses.dataclass(frozen=True)
class NoneGradient:
    """Why one source got no gradient.

    Attributes:
        source: the source, as passed in.
        reason: one of `REASONS`.
        message: the explanation, in words.
    """
    source: Any
    reason: str
    message: str


@dataclasses.dataclass(frozen=True)
class Explanation:
    """What `explain` found: the gradients, a reason for each None, and the
    sources whose gradient is a total derivative (the sum over a distributed
    variable's components: in cross-replica context, and from a tape that
    recorded the replicas of a strategy.run)."""
    gradients: Any
    none_gradients: list[NoneGradient]
    total_derivatives: list[Any] = dataclasses.field(default_factory=list)

    def __str__(self):
        lines = []
        if self.total_derivatives:
            lines.append(
                "total derivatives (summed over the replicas' components): " +
                ", ".join(map(_label, self.total_derivatives)))
        lines += [f"{_label(item.source)}: {item.message}"
                  for item in self.none_gradients]
        return "\n".join(lines) or "every source has a gradient"


def explain(tape, target, sources, **gradient_options):
    """Computes `tape.gradient(target, sources, **gradient_options)` and
    explains every None in it.

    Like `tape.gradient`, this uses up a tape that is not persistent.

    Raises:
        RuntimeError: the tape was already used by a non-persistent gradient.
        Whatever `tape.gradient` raises for these arguments.
    """
    if tape._tape is None:
        raise RuntimeError(errors.message(
            "cannot explain a used tape", "tfdtape.explain",
            "a tape that can still compute gradients",
            "a non-persistent tape already used by tape.gradient",
            "Call tfdtape.explain instead of tape.gradient, or create the "
            "tape with persistent=True"))
    recorded = tape._tape
    with events.gradient_totals() as summed:
        gradients = tape.gradient(target, sources, **gradient_options)
    none_gradients = [
        NoneGradient(*found) for found in none_reasons(
            tape, recorded, nest.flatten(sources), nest.flatten(gradients),
            summed.summing)]
    return Explanation(gradients, none_gradients,
                       [source for source, _ in summed.totals])


def none_reasons(tape, recorded, flat_sources, flat_gradients, summing):
    """(source, reason, message) for every source whose gradient is None.

    Called right after `tape.gradient`, in the context it ran in.

    Args:
        tape: the GradientTape.
        recorded: its `tape._tape` from before the gradient call (a
            non-persistent tape drops it), which still knows what it watched.
        flat_sources: the sources, flat, as passed.
        flat_gradients: the gradients, flat, in the same order.
        summing: whether the call differentiated distributed sources by all
            their components (tfdtape's gradient outside replica context), or
            as TensorFlow does (stock: outside any strategy, the first).
    """
    missing = [source for source, gradient in zip(flat_sources, flat_gradients)
               if gradient is None]
    if not missing:
        return []
    known_tensors = _known_to_tape(
        recorded, [s for s in missing if _pywrap_utils.IsTensor(s)])
    facts = _Facts(
        watched=resolution.watched_by(tape),
        watches_reads=tape._watch_accessed_variables,
        context=events.context_now(), summing=summing)
    found = []
    for source in missing:
        if _pywrap_utils.IsTensor(source):
            reason = _tensor_reason(any(source is t for t in known_tensors))
        else:
            reason = _variable_reason(
                keras_variables.unwrap(source, "tfdtape.explain"), facts)
        found.append((source, *reason))
    return found


@dataclasses.dataclass(frozen=True)
class _Facts:
    """What the reasons are decided from.

    Attributes:
        watched: the tape's watched variables.
        watches_reads: whether the tape watched the variables it saw read.
        context: where the gradient is taken: "no strategy", "replica" or
            "cross-replica".
        summing: whether distributed sources were differentiated by all
            their components.
    """
    watched: Any
    watches_reads: bool
    context: str
    summing: bool

    def holds(self, value):
        return any(value is w for w in self.watched)


def _known_to_tape(recorded, tensors):
    """The tensors of `tensors` that the tape `recorded` (a GradientTape's
    `_tape`) watches or computed while recording. Asked in a thread of its
    own, where no other tape is active."""
    if not tensors:
        return []
    known = []

    def ask():
        handle = recorded._tape
        pywrap_tfe.TFE_Py_TapeSetAdd(handle)
        try:
            known.extend(t for t in tensors
                         if pywrap_tfe.TFE_Py_TapeSetShouldRecordBackprop([t]))
        finally:
            pywrap_tfe.TFE_Py_TapeSetRemove(handle)

    thread = threading.Thread(target=ask, name="tfdtape-explain")
    thread.start()
    thread.join()
    return known


def _tensor_reason(known):
    """(reason, message) for a tensor source whose gradient is None."""
    if known:
        return NOT_CONNECTED, (
            "the tape knows it (watched, or computed while recording), but the "
            "target does not depend on it")
    return NOT_WATCHED, (
        "a tensor is watched only by tape.watch(), and the tape did not watch "
        "it or compute it while recording; call tape.watch() on it inside the "
        "tape's with-block")


def _variable_reason(source, facts):
    """(reason, message) for a variable source whose gradient is None."""
    if resolution.is_distributed_variable(source):
        found = _distributed_reason(source, facts)
    else:
        found = _component_or_plain_reason(source, facts)
    if found is not None:
        return found
    if not facts.watches_reads:
        return NOT_WATCHED, (
            "the tape was created with watch_accessed_variables=False and "
            "tape.watch() was not called for it")
    if not getattr(source, "trainable", True):
        return NOT_TRAINABLE, (
            "it was created with trainable=False, and a tape watches only "
            "the trainable variables it sees read; call tape.watch() on it "
            "inside the tape's with-block, or make it trainable")
    return NOT_READ, (
        "the tape never saw it read: it was read before the tape started "
        "recording (or outside its with-block), only through "
        "tf.stop_gradient, or not at all")


def _distributed_reason(source, facts):
    """The reason for a distributed variable the tape knows in some form,
    or None when it knows it in none.

    Where the gradient is taken decides what the variable stands for: in
    cross-replica context, and outside any strategy with tfdtape's gradient,
    all its components (the total derivative); in replica context the
    current replica's component; outside any strategy on stock TensorFlow
    its first component.
    """
    components = list(source.values)
    if facts.context == "cross-replica" or facts.summing:
        if facts.holds(source) or any(facts.holds(c) for c in components):
            return _not_connected()
        return None
    differentiated = components[_replica_index() if facts.context == "replica"
                                else 0]
    held = [c for c in components if facts.holds(c)]
    # The tape watches the container through the handle of the component the
    # context picks, which is the one differentiated here (a container
    # watched inside another replica's strategy.run cannot be told apart).
    # Only the component differentiated here: watched in this replica as it
    # is (TensorFlow before the commit), and not connected.
    if facts.holds(source) or (held and all(c is differentiated for c in held)):
        return _not_connected()
    if not held:
        return None
    where = ("inside strategy.run, where each replica differentiates its own "
             "component" if facts.context == "replica" else
             "outside any strategy, where the variable stands for its first "
             "component")
    return WRONG_CONTEXT, (
        "the tape recorded in cross-replica context (inside strategy.scope(), "
        "outside strategy.run), where it watches the components, but the "
        f"gradient is taken {where}; take the gradient where the tape "
        "recorded")


def _component_or_plain_reason(source, facts):
    """The reason for a component or plain variable the tape knows in some
    form, or None when it knows it in none."""
    if facts.holds(source):
        return _not_connected()
    container = resolution.container_of(source)
    if container is None or not facts.holds(container):
        return None
    if (facts.context == "replica" and
            container.values[_replica_index()] is source):
        return _not_connected()  # The container's handle here is this one's.
    return WATCHED_CONTAINER, (
        f"the tape watched its container {container.name!r} (a "
        f"{type(container).__name__}), not this component; take the "
        "gradient with respect to the container")


def _replica_index():
    """The current replica's index (replica context only)."""
    return values_util.get_current_replica_id_as_int()


def _not_connected():
    return NOT_CONNECTED, (
        "it was watched, but the target does not depend on it (it was "
        "read through tf.stop_gradient, a non-differentiable op, or not "
        "used in the target at all)")


def _label(source):
    return f"{type(source).__name__} {keras_variables.label(source)!r}"
