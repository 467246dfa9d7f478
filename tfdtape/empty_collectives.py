"""Tensors of no elements through TensorFlow's collective launcher.

Every collective of MultiWorkerMirroredStrategy, and of MirroredStrategy
where it reduces with collectives (TensorFlow 2.21's choice on CPUs), is issued
by `CollectiveReplicaLauncher.all_reduce` or `._all_gather` (which
`all_gather`, `batch_all_reduce` and `all_reduce_indexed_slices` call).
TensorFlow's collective kernels end the process with SIGSEGV on some
tensors of no elements: any all-gather, eagerly or in a `tf.function`, and
an all-reduce of one made from an empty NumPy array, eagerly or traced
for a shape not known then (measured on
2.21 and the pinned nightly; 2.12.1 transfers them, the padding changes
nothing there). A replica or worker whose last batch
has no rows meets it in `strategy.gather`, `ReplicaContext.all_gather`,
`ReplicaContext.all_reduce`, `strategy.reduce` and an embedding's gradient
with no rows (`all_reduce_indexed_slices`).

The replacements send such a tensor flat with one zero element and take
that element off what comes back, so the collective moves at least one
element; the result has the shape, dtype and device TensorFlow's would
have. Every member of one collective holds a tensor of the same shape when
it runs, but what each knows of that shape when tracing may differ (a
`tf.function` one worker retraced with a relaxed shape, a replica's
`IndexedSlices` of unknown length): so where the static shape says the
tensor has elements it goes to TensorFlow's function unchanged, where it
says none it is padded, and where it does not tell (graphs only) a `cond`
pads it when it runs, the tensor itself sent otherwise. All members then
send the same shape. Each replacement calls TensorFlow's function exactly
once, so every process takes the same collective instance keys in the same
order.

A new variable's initial value is broadcast from the chief by
`CollectiveAllReduceExtended._get_variable_creator_initial_value`, which
calls TensorFlow's collective ops directly: one of no elements made from
NumPy ends the chief with SIGSEGV there (2.21). The replacement evaluates
the initial value first and, where its static shape says it has no
elements, gives it as it is on every worker (there is nothing to
broadcast) without calling TensorFlow's function; every other value goes
to TensorFlow's, evaluated once.
"""

import functools

from tensorflow.python.framework import ops
from tensorflow.python.framework import tensor_util
from tensorflow.python.ops import array_ops
from tensorflow.python.trackable import base as trackable_base

from tfdtape import compat

ALL_REDUCE_PARAMETERS = ("self", "input_tensor", "control_input", "options")
ALL_GATHER_PARAMETERS = ("self", "input_tensor", "options")
INITIAL_VALUE_PARAMETERS = ("self", "replica_id", "device", "primary_var", "kwargs")


def _as_tensor(launcher, value):
    """`value` as a tensor (converted on the launcher's device, where
    TensorFlow's collective would convert it)."""
    if tensor_util.is_tf_type(value):
        return value
    with ops.device(launcher._device):
        return ops.convert_to_tensor(value)


def _has_elements(tensor):
    """Whether `tensor`'s static shape says it has elements."""
    elements = tensor.shape.num_elements()
    return elements is not None and elements > 0


def _sent(tensor):
    """What the collective gets for `tensor`, whose static shape does not say
    it has elements: flat with one zero element where it has none, itself
    otherwise (decided when running where the static shape does not tell)."""
    def padded():
        return array_ops.concat(
            [array_ops.reshape(tensor, [-1]), array_ops.zeros([1], tensor.dtype)], 0)

    if tensor.shape.num_elements() == 0:
        return padded()
    return compat.cond(array_ops.size(tensor) > 0,
                       lambda: array_ops.identity(tensor), padded)


def make_all_reduce(original):
    """`CollectiveReplicaLauncher.all_reduce`, a tensor of no elements padded."""

    @functools.wraps(original)
    def all_reduce(self, input_tensor, control_input=None, options=None):
        """TensorFlow's all-reduce of `input_tensor`; one of no elements
        travels padded with one (the module's rule)."""
        tensor = _as_tensor(self, input_tensor)
        if _has_elements(tensor):
            return original(self, input_tensor, control_input, options)
        reduced = original(self, _sent(tensor), control_input, options)
        with ops.device(self._device):
            flat = array_ops.reshape(reduced, [-1])[:array_ops.size(tensor)]
            return array_ops.reshape(flat, array_ops.shape(tensor))

    return all_reduce


def make_all_gather(original):
    """`CollectiveReplicaLauncher._all_gather`, a tensor of no elements
    padded (each member's part keeps its padding until the parts are apart
    again)."""

    @functools.wraps(original)
    def _all_gather(self, input_tensor, options):
        """TensorFlow's all-gather of `input_tensor`; one of no elements
        travels padded with one (the module's rule)."""
        tensor = _as_tensor(self, input_tensor)
        if _has_elements(tensor):
            return original(self, input_tensor, options)
        gathered = original(self, _sent(tensor), options)
        with ops.device(self._device):
            shape = array_ops.shape(tensor)
            parts = array_ops.reshape(gathered, [self._group_size, -1])
            own = parts[:, :array_ops.size(tensor)]
            return array_ops.reshape(
                own, array_ops.concat([[self._group_size * shape[0]], shape[1:]], 0))

    return _all_gather


def make_variable_creator_initial_value(original):
    """`CollectiveAllReduceExtended._get_variable_creator_initial_value`: an
    initial value of no elements is not broadcast (the module's rule)."""

    @functools.wraps(original)
    def _get_variable_creator_initial_value(self, replica_id, device, primary_var, **kwargs):
        """TensorFlow's initial-value function of a new variable's
        component; on a worker's first replica of a job of several workers,
        one that evaluates the initial value and gives it unbroadcast where
        it has no elements."""
        if replica_id != 0 or self._num_workers <= 1:
            return original(self, replica_id, device, primary_var, **kwargs)

        def initial_value_fn():
            with ops.device(device):
                value = kwargs["initial_value"]
                if callable(value):
                    value = value()
                restored = isinstance(value, trackable_base.CheckpointInitialValue)
                tensor = ops.convert_to_tensor(value.wrapped_value if restored else value,
                                               dtype=kwargs.get("dtype", None))
            if tensor.shape.num_elements() == 0:
                return tensor
            given = dict(kwargs, initial_value=value)  # evaluated once: the same draw
            return original(self, replica_id, device, primary_var, **given)()

        return initial_value_fn

    return _get_variable_creator_initial_value
