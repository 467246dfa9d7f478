"""`tfdtape.explain`: why did `tape.gradient` return None for a source?

Call `explain(tape, target, sources)` where you would call
`tape.gradient(target, sources)`: it computes the gradients the same way and,
for every source whose gradient is None, says why in plain words, from what
the tape watched, the source's kind, and the context the call is made in.
"""

import dataclasses
from typing import Any, List

from tensorflow.python.ops import variables
from tensorflow.python.util import nest

from tfdtape import compat
from tfdtape import errors
from tfdtape import resolution

NOT_WATCHED = "not watched"
NOT_READ = "not read while recording"
CREATED_OUTSIDE_SCOPE = "created outside strategy.scope()"
WATCHED_CONTAINER = "watched as the container"
WRONG_CONTEXT = "gradient taken in the wrong context"
NOT_CONNECTED = "not connected to the target"


@dataclasses.dataclass(frozen=True)
class NoneGradient:
    """Why one source got no gradient.

    Attributes:
        source: the source, as passed in.
        reason: one of this module's reason constants.
        message: the explanation, in words.
    """
    source: Any
    reason: str
    message: str


@dataclasses.dataclass(frozen=True)
class Explanation:
    """What `explain` found: the gradients, and a reason for each None."""
    gradients: Any
    none_gradients: List[NoneGradient]

    def __str__(self):
        if not self.none_gradients:
            return "every source has a gradient"
        return "\n".join(f"{_label(item.source)}: {item.message}"
                         for item in self.none_gradients)


def explain(tape, target, sources, **gradient_options):
    """Computes `tape.gradient(target, sources, **gradient_options)` and
    explains every None in it.

    Like `tape.gradient`, this uses up a tape that is not persistent.

    Raises:
        RuntimeError: the tape was already used by a non-persistent gradient.
    """
    if tape._tape is None:  # pylint: disable=protected-access
        raise RuntimeError(errors.message(
            "cannot explain a used tape", "tfdtape.explain",
            "a tape that can still compute gradients",
            "a non-persistent tape already used by tape.gradient",
            "Call tfdtape.explain instead of tape.gradient, or create the "
            "tape with persistent=True"))
    recorded_without_reads = not tape._watch_accessed_variables  # pylint: disable=protected-access
    gradients = tape.gradient(target, sources, **gradient_options)
    watched = tape.watched_variables()
    none_gradients = [
        NoneGradient(source, *_reason(_tf_variable(source), watched,
                                      recorded_without_reads))
        for source, gradient in zip(nest.flatten(sources), nest.flatten(gradients))
        if gradient is None]
    return Explanation(gradients, none_gradients)


def _reason(source, watched, recorded_without_reads):
    """(reason, message) for one source whose gradient is None."""
    def holds(value):
        return any(value is w for w in watched)

    distributed = resolution.is_distributed_variable(source)
    components = list(source.values) if distributed else []
    container = resolution.container_of(source)
    in_replica_context = compat.strategy_context.get_replica_context() is not None
    if distributed and in_replica_context and any(holds(c) for c in components):
        return WRONG_CONTEXT, (
            "the tape recorded in cross-replica context (inside "
            "strategy.scope(), outside strategy.run), where it watches the "
            "components, but the gradient is taken inside strategy.run, where "
            "each replica differentiates its own component; take the gradient "
            "where the tape recorded")
    if container is not None and holds(container):
        return WATCHED_CONTAINER, (
            f"the tape watched its container {container.name!r} (a "
            f"{type(container).__name__}), not this component; take the "
            "gradient with respect to the container")
    if holds(source):
        return NOT_CONNECTED, (
            "it was watched, but the target does not depend on it (it was "
            "read through tf.stop_gradient, a non-differentiable op, or not "
            "used in the target at all)")
    if recorded_without_reads:
        return NOT_WATCHED, (
            "the tape was created with watch_accessed_variables=False and "
            "tape.watch() was not called for it")
    if (not distributed and container is None and
            compat.strategy_context.has_strategy()):
        return CREATED_OUTSIDE_SCOPE, (
            "it is a plain variable, created outside strategy.scope(), and the "
            "tape never saw it read; create it inside strategy.scope() and "
            "read it inside the tape's with-block")
    return NOT_READ, (
        "the tape never saw it read: it was read before the tape started "
        "recording (or outside its with-block), or not read at all")


def _tf_variable(source):
    """The tf.Variable a Keras 3 variable wraps (its `.value`); else `source`."""
    wrapped = getattr(type(source), "value", None)
    if isinstance(wrapped, property):
        value = source.value
        if isinstance(value, variables.Variable):
            return value
    return source


def _label(source):
    return f"{type(source).__name__} {getattr(source, 'name', '')!r}".strip()
