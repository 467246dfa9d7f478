"""What a gradient tape watches for a variable: the commit's resolution rule.

In replica context (inside `strategy.run`, or with no strategy at all) the
tape watches the variable's container, `strategy.extended.value_container(v)`;
in cross-replica context (inside `strategy.scope()`, outside `run`) it watches
every local component, `strategy.experimental_local_results(v)`. A plain
variable resolves to itself in every context, so it skips the strategy lookup:
`variable_accessed` runs on every trainable-variable read in eager mode.
"""

import numbers

from tensorflow.python.distribute import mirrored_strategy
from tensorflow.python.distribute import values as values_lib
from tensorflow.python.distribute import values_util
from tensorflow.python.framework import ops
from tensorflow.python.ops import resource_variable_ops
from tensorflow.python.util import _pywrap_utils

from tfdtape import errors
from tfdtape import events
from tfdtape import keras_variables

RESOURCE_VARIABLE = resource_variable_ops.ResourceVariable
CONTAINER_REFERENCE = "_distributed_container"
"""Key of a component's back-reference to its distributed container, in its
handle's `__dict__`."""
AGGREGATING_REFERENCE = "_aggregating_container"
"""Key of an AggregatingVariable's inner variable's back-reference, in the
inner variable's own `__dict__`.

A ResourceVariable with neither is plain: it resolves to itself in every
context (`tape_functions.variable_accessed` inlines that test)."""
_REPLICA_VALUE_TYPES = (values_lib.DistributedValues,)
_VARIABLE_TYPES = (values_lib.DistributedVariable,)
_get_default_graph = ops.get_default_graph
_RESOLVE_SYMBOL = "tfdtape.resolve"

# Strategy type -> whether its extended.value_container is MirroredStrategy's
# (also MultiWorkerMirroredStrategy's), which maps a ResourceVariable
# component to its container through the weak reference on its handle and a
# container to itself. Other strategies are asked through value_container.
_follows_reference = {}
_REFERENCE_FOLLOWING = mirrored_strategy.MirroredExtended.value_container


def _value_container_follows_reference(strategy_type, strategy):
    """True if `strategy.extended.value_container` is MirroredStrategy's."""
    follows = _follows_reference.get(strategy_type)
    if follows is None:
        extended_type = type(strategy.extended)
        follows = getattr(extended_type, "value_container",
                          None) is _REFERENCE_FOLLOWING
        _follows_reference[strategy_type] = follows
    return follows


def resolve(variable):
    """Returns the tuple of variables a tape watches for `variable` here.

    `variable` is a `tf.Variable` (distributed or not), a Keras 3 variable
    (resolved as the `tf.Variable` it wraps) or a `tf.Tensor` (which comes
    back unchanged as a 1-tuple).

    Raises:
        tfdtape.errors.NotWatchableError: `variable` is anything else (None,
            a Python number, string, list or dict, a NumPy array, a
            per-replica value such as `PerReplica`), or, in replica context,
            a distributed variable of another strategy that has no component
            for the current replica.
    """
    # A ResourceVariable that belongs to a container has a weak reference to
    # it: a distributed variable's component in its handle's __dict__ (read
    # directly: getattr on an EagerTensor for a missing attribute is slow),
    # an AggregatingVariable's inner variable (CentralStorageStrategy,
    # ParameterServerStrategy) in its own __dict__. A variable with neither
    # is plain and resolves to itself in every context.
    if type(variable) is RESOURCE_VARIABLE:
        reference = variable._handle.__dict__.get(CONTAINER_REFERENCE)
        if reference is None and AGGREGATING_REFERENCE not in variable.__dict__:
            return (variable,)  # Plain: itself in every context.
        return _resolve_in_context(variable, reference, False)
    if isinstance(variable, _VARIABLE_TYPES):
        return _resolve_in_context(variable, None, True)
    inner = keras_variables.wrapped_variable(variable, _RESOLVE_SYMBOL)
    if inner is not None:
        return resolve(inner)
    check_watchable(variable, _RESOLVE_SYMBOL)
    if not (_pywrap_utils.IsTensor(variable) or
            _pywrap_utils.IsVariable(variable)):
        raise events.refused(errors.NotWatchableError(errors.message(
            "cannot resolve this object", _RESOLVE_SYMBOL,
            "one tf.Variable, Keras variable or tf.Tensor",
            f"an object of type {type(variable).__name__}",
            "Resolve each variable of a structure on its own")))
    return _resolve_in_context(variable, None, False)


def _resolve_in_context(variable, reference, is_container):
    """`resolve` for a variable or tensor that may belong to a strategy.

    Args:
        variable: what to resolve.
        reference: the weak reference to `variable`'s distributed container
            when it is a component, else None.
        is_container: whether `variable` is a distributed container.
    """
    stack = _get_default_graph()._distribution_strategy_stack
    if not stack:
        # The default strategy's replica context: its value_container is the
        # identity, so every value resolves to itself.
        return (variable,)
    mode = stack[-1]
    strategy = mode.strategy
    if mode.replica_context is None:
        return tuple(strategy.experimental_local_results(variable))
    container = variable if is_container else (
        reference() if reference is not None else None)
    if (container is not None and
            container._distribute_strategy is not strategy):
        _check_has_replica_component(container, strategy)
    if _value_container_follows_reference(type(strategy), strategy):
        if container is not None:
            return (container,)
        if reference is not None:
            return (variable,)  # Its container is gone.
    return (strategy.extended.value_container(variable),)


def _check_has_replica_component(container, strategy):
    """Raises if `container`, a distributed variable of another strategy than
    the current `strategy`, has no component for the current replica.

    Stock TensorFlow reads such a variable in the replicas it has components
    for, and fails with an IndexError in the others; tfdtape says why.
    """
    replica_id = values_util.get_current_replica_id_as_int()
    components = len(container._values)
    if replica_id is None or replica_id < components:
        return
    owner = container._distribute_strategy
    raise events.refused(errors.NotWatchableError(errors.message(
        f"variable {container.name!r} belongs to another strategy",
        "tf.GradientTape.watch",
        f"a variable of the current strategy, {_describe_strategy(strategy)}",
        f"a {type(container).__name__} of {_describe_strategy(owner)}, which "
        f"has {components} local components and none for replica "
        f"{replica_id}",
        "Create the variable inside the scope of the strategy whose "
        "strategy.run uses it")))


def _describe_strategy(strategy):
    """E.g. 'a MirroredStrategy with 2 replicas'."""
    return (f"a {type(strategy).__name__} with "
            f"{strategy.num_replicas_in_sync} replicas")


def container_of(variable):
    """The distributed container `variable` is a component of, or None.

    None for a container itself (which reaches its primary component's
    handle, and so the back-reference, through attribute delegation) and for
    anything that is not a component. Reads the same back-reference as
    `resolve`, without its fast path: on the handle of a ResourceVariable
    component, on the component itself where it is no CompositeTensor (the
    `UnliftedInitializerVariable` components of a distributed variable
    created inside a `tf.function`).
    """
    if is_distributed_variable(variable) or not hasattr(variable, "__dict__"):
        return None
    own = vars(variable)
    reference = (getattr(own.get("_handle"), "__dict__", {}).get(CONTAINER_REFERENCE)
                 or own.get(CONTAINER_REFERENCE))
    return reference() if reference is not None else None


def watched_by(tape):
    """The variables `tape` (a GradientTape) watches as TensorFlow's tape
    keeps them: each as the tape functions resolved it (the components,
    after a watch in cross-replica context), once per handle it was watched
    through. `tape.watched_variables()` lists each variable once."""
    recorded = tape._tape
    if recorded is None:  # A non-persistent gradient kept TensorFlow's list.
        return tuple(tape._watched_variables)
    return tuple(recorded.watched_variables())


def is_distributed_variable(value):
    """True for a `tf.distribute` variable container such as `MirroredVariable`."""
    return isinstance(value, _VARIABLE_TYPES)


def check_watchable(value, symbol):
    """Raises NotWatchableError for values no tape can watch.

    Those are None, Python numbers and strings, and per-replica values such
    as `PerReplica`; anything else passes.

    Args:
        value: the object to check.
        symbol: the API the user called, named in the message.
    """
    if isinstance(value, _REPLICA_VALUE_TYPES) and not is_distributed_variable(value):
        raise events.refused(errors.NotWatchableError(errors.message(
            "cannot watch a per-replica value", symbol,
            "a tf.Variable or tf.Tensor",
            f"a {type(value).__name__} holding one value per replica",
            "Watch the tensor inside strategy.run, where each replica sees "
            "its own value, or watch the variable it was computed from")))
    if value is None or isinstance(value, (str, bytes, numbers.Number)):
        raise events.refused(errors.NotWatchableError(errors.message(
            "cannot watch a non-tensor", symbol,
            "a tf.Variable or tf.Tensor",
            f"{value!r} of type {type(value).__name__}",
            "Pass a tf.Variable, or convert the value with tf.constant "
            "first")))
