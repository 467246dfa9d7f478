"""Each replica's backward pass on its own device, for tapes around `strategy.run`.

A tape recording around `strategy.run` records every replica's operations,
each placed on its replica's device; its backward pass runs in
`tape.gradient`, outside the replicas, where TensorFlow would put every
replica's gradient operations on the default device (eagerly) or on no
device at all (in a `tf.function`). On N GPUs one of them would compute and
hold every replica's backward pass. The tutorial step, whose tape is inside
the replicas, runs each replica's backward pass on that replica's device.

TensorFlow computes each recorded operation's gradient through one Python
function it registers with its C++ tape (`backprop._gradient_function`,
registered by `pywrap_tfe.TFE_Py_RegisterGradientFunction`), and sums the
gradients a tensor gets along several paths through another
(`backprop._aggregate_grads`, in the vector space it registers). tfdtape's
replacements run the originals under `tf.device` of the operation
differentiated (its outputs' device, else its inputs'; in a graph, the
operation's own device), and of the gradients summed, while a tape that
recorded the replicas of a `strategy.run` computes its gradient
(`placing()`), as `colocate_gradients_with_ops` did for `tf.gradients`.

Operations recorded with a backward function of their own
(`record.record_operation`: `tf.custom_gradient`, a `tf.function` called
inside the replica function, `tf.recompute_grad`) are recorded while the
replica runs (`recording_replica()`); tfdtape's `record_operation` notes the
device of such an operation's outputs (else inputs) then, and its backward
function runs under that device inside `placing()`. Other tapes' gradients,
and operations recorded outside a replica, run as in TensorFlow.
"""

import contextlib
import functools
import threading

from tensorflow.python import pywrap_tfe
from tensorflow.python.eager import backprop
from tensorflow.python.framework import indexed_slices
from tensorflow.python.framework import ops

from tfdtape import compat
from tfdtape import process_state

# Kept across importlib.reload: a gradient being computed stays placed.
_state = process_state.kept(globals(), "_state", threading.local)
"""Per thread, `.depth`: how many placing() blocks are open."""


@contextlib.contextmanager
def placing():
    """Inside the block, this thread's gradient computations put each
    operation's gradient on the device of the operation."""
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


@contextlib.contextmanager
def recording_replica():
    """Inside the block, this thread runs a replica function whose operations
    a tape around `strategy.run` records: operations recorded with their own
    backward function note their device."""
    _state.replicas = getattr(_state, "replicas", 0) + 1
    try:
        yield
    finally:
        _state.replicas -= 1


def make_record_operation(original):
    """Returns a `record.record_operation` (or `record_operation_backprop_only`,
    same leading parameters) that, inside `recording_replica()`, records a
    backward function running on the recorded operation's device inside
    `placing()`."""

    @functools.wraps(original)
    def record_operation(op_type, output_tensors, input_tensors,
                         backward_function, *rest, **options):
        if getattr(_state, "replicas", 0):
            backward_function = _placed(
                backward_function, _forward_device(output_tensors, input_tensors))
        return original(op_type, output_tensors, input_tensors,
                        backward_function, *rest, **options)

    return record_operation


def _placed(backward_function, device):
    """`backward_function`, run inside `placing()` under `device` (none
    where unknown) and outside any strategy's cross-replica context.

    It was recorded inside a replica and runs outside it: what it asks of
    the strategy (`tf.recompute_grad` recomputing the replica's operations)
    gets the default strategy's replica context there, as with no scope
    around the step, whose collectives tfdtape refuses
    (`spanning_tapes.check_not_differentiating_replicas`), rather than
    none, which Keras's synchronized BatchNormalization takes for "not
    distributed" and silently computes local statistics."""

    def placed_backward(*gradients, **options):
        if not getattr(_state, "depth", 0):
            return backward_function(*gradients, **options)
        compat.strategy_context._push_per_thread_mode(
            compat.strategy_context._get_default_replica_mode())
        try:
            with ops.device(device) if device else contextlib.nullcontext():
                return backward_function(*gradients, **options)
        finally:
            compat.strategy_context._pop_per_thread_mode()

    return placed_backward


def make_gradient_function(original):
    """Returns a gradient function (TensorFlow's `_gradient_function`, same
    parameters) that, inside `placing()`, runs `original` on the forward
    operation's device."""

    @functools.wraps(original)
    def _gradient_function(op_name, attr_tuple, num_inputs, inputs, outputs,
                           out_grads, skip_input_indices,
                           forward_pass_name_scope):
        device = (_forward_device(outputs, inputs, out_grads)
                  if getattr(_state, "depth", 0) else None)
        if not device:
            return original(op_name, attr_tuple, num_inputs, inputs, outputs,
                            out_grads, skip_input_indices,
                            forward_pass_name_scope)
        with ops.device(device):
            return original(op_name, attr_tuple, num_inputs, inputs, outputs,
                            out_grads, skip_input_indices,
                            forward_pass_name_scope)

    return _gradient_function


def make_aggregate_grads(original):
    """Returns a gradient aggregation (TensorFlow's `_aggregate_grads`: the
    sum of the gradients a tensor gets along several paths) that, inside
    `placing()`, runs `original` on the device of the first gradient (that
    tensor's)."""

    @functools.wraps(original)
    def _aggregate_grads(gradients):
        device = (_forward_device(gradients, ())
                  if getattr(_state, "depth", 0) and len(gradients) > 1 else None)
        if not device:
            return original(gradients)
        with ops.device(device):
            return original(gradients)

    return _aggregate_grads


def register_aggregation(aggregate_grads):
    """Hands TensorFlow's C++ tape its vector space with `aggregate_grads`
    (TensorFlow's own `_default_vspace` otherwise)."""
    pywrap_tfe.TFE_Py_RegisterVSpace(
        backprop._default_vspace._replace(aggregate_fn=aggregate_grads))


def _forward_device(outputs, inputs, out_grads=()):
    """The device the forward operation ran on, or None where unknown.

    Its outputs' device where TensorFlow passes them (it passes None for
    what the gradient needs not), else its inputs' where they agree; where
    they differ (a replica's variable and data from another device) or
    neither is passed, the device the upstream gradient came from (the
    replica's next operation's), if one of the inputs' devices, else the
    first input's. In a graph a tensor's device is its operation's.
    """
    devices = []
    for tensors in (outputs, inputs):
        devices = [device for device in map(device_of, tensors or ()) if device]
        if devices:
            break
    upstream = [device for device in map(device_of, out_grads or ()) if device]
    if not devices:
        return upstream[0] if upstream else None
    if len(set(devices)) == 1:
        return devices[0]
    return upstream[0] if upstream and upstream[0] in devices else devices[0]


def device_of(tensor):
    """An eager tensor's device, a graph tensor's operation's; None for None
    and where unplaced."""
    if isinstance(tensor, indexed_slices.IndexedSlices):
        tensor = tensor.values
    if tensor is None:
        return None
    if isinstance(tensor, ops.EagerTensor):
        return tensor.device
    return getattr(getattr(tensor, "op", None), "device", None) or None
