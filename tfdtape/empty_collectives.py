"""Tensors of no elements through TensorFlow's collective launcher.

Every collective of MultiWorkerMirroredStrategy, and of MirroredStrategy
where it reduces with collectives (TensorFlow 2.21's choice on CPUs), is issued
by `CollectiveReplicaLauncher.all_reduce` or `._all_gather` (which
`all_gather`, `batch_all_reduce` and `all_reduce_indexed_slices` call).
TensorFlow's collective kernels end the process with SIGSEGV on some
tensors of no elements: any all-gather, eagerly or in a `tf.function`, and
an eager all-reduce of one made from an empty NumPy array (measured on
2.21 and the pinned nightly; 2.12.1 transfers them, the padding changes
nothing there). A replica or worker whose last batch
has no rows meets it in `strategy.gather`, `ReplicaContext.all_gather`,
`ReplicaContext.all_reduce`, `strategy.reduce` and an embedding's gradient
with no rows (`all_reduce_indexed_slices`).

The replacements send such a tensor flat with one zero element after its
own and take that element off what comes back, so the collective moves at
least one element; the result has the shape, dtype and device TensorFlow's
would have. A tensor that may be empty is one of no elements eagerly; in a
graph, for an all-gather, one whose shape is not fully known or has no
elements (TensorFlow's `all_gather` pads to a length known only when it
runs, so every process decides alike), and for an all-reduce, one whose
shape has no elements (all-reduces of a shape known only when running do
not crash, and stay as TensorFlow issues them). Each replacement calls
TensorFlow's function exactly once, so every process takes the same
collective instance keys in the same order; any other tensor goes to
TensorFlow's function unchanged.
"""

import functools

from tensorflow.python.eager import context
from tensorflow.python.framework import ops
from tensorflow.python.framework import tensor_util
from tensorflow.python.ops import array_ops

ALL_REDUCE_PARAMETERS = ("self", "input_tensor", "control_input", "options")
ALL_GATHER_PARAMETERS = ("self", "input_tensor", "options")


def _as_tensor(launcher, value):
    """`value` as a tensor (converted on the launcher's device, where
    TensorFlow's collective would convert it)."""
    if tensor_util.is_tf_type(value):
        return value
    with ops.device(launcher._device):
        return ops.convert_to_tensor(value)


def _has_no_elements(tensor):
    return tensor.shape.num_elements() == 0


def _may_be_empty_gathered(tensor):
    """Whether an all-gather sends `tensor` padded (the module's rule)."""
    if context.executing_eagerly():
        return _has_no_elements(tensor)
    return not tensor.shape.is_fully_defined() or _has_no_elements(tensor)


def _padded(tensor):
    """`tensor` flat, with one zero element after its own."""
    return array_ops.concat(
        [array_ops.reshape(tensor, [-1]), array_ops.zeros([1], tensor.dtype)], 0)


def make_all_reduce(original):
    """`CollectiveReplicaLauncher.all_reduce`, a tensor of no elements padded."""

    @functools.wraps(original)
    def all_reduce(self, input_tensor, control_input=None, options=None):
        """TensorFlow's all-reduce of `input_tensor`; one of no elements
        travels padded with one (the module's rule)."""
        tensor = _as_tensor(self, input_tensor)
        if not _has_no_elements(tensor):
            return original(self, input_tensor, control_input, options)
        reduced = original(self, _padded(tensor), control_input, options)
        with ops.device(self._device):
            return array_ops.reshape(reduced[:-1], array_ops.shape(tensor))

    return all_reduce


def make_all_gather(original):
    """`CollectiveReplicaLauncher._all_gather`, a tensor that may have no
    elements padded (each process's part keeps its own padding until the
    parts are apart again)."""

    @functools.wraps(original)
    def _all_gather(self, input_tensor, options):
        """TensorFlow's all-gather of `input_tensor`; one that may have no
        elements travels padded with one (the module's rule)."""
        tensor = _as_tensor(self, input_tensor)
        if not _may_be_empty_gathered(tensor):
            return original(self, input_tensor, options)
        gathered = original(self, _padded(tensor), options)
        with ops.device(self._device):
            shape = array_ops.shape(tensor)
            parts = array_ops.reshape(gathered, [self._group_size, -1])[:, :-1]
            return array_ops.reshape(
                parts, array_ops.concat([[self._group_size * shape[0]], shape[1:]], 0))

    return _all_gather
