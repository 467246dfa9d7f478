"""Where the TensorFlow pieces tfdtape uses live, in each supported release.

- The strategy-context functions (`get_strategy_and_replica_context`,
  `get_strategy`, `get_replica_context`, `has_strategy`) are in
  `distribute/distribute_lib.py` from 2.13, in
  `distribute/distribution_strategy_context.py` in 2.12.
- TensorFlow's own watched-variable resolution is a registry
  (`tape.register_watched_variable_resolver`, filled by distribute_lib at
  import) from 2.13, and written inline in the tape functions in 2.12.
- `Assert` is in `ops/control_flow_assert.py` from 2.13, in
  `ops/control_flow_ops.py` in 2.12.
- `record_operation` (and `record_operation_backprop_only`), which records an
  operation with a backward function of its own, is in `eager/record.py`
  from 2.13, in `eager/tape.py` in 2.12; callers look it up there at call
  time.
- `Tensor` is in `framework/tensor.py` where that module exists, in
  `framework/ops.py` before (2.12).
- `stack` (`tf.stack`) is in `ops/array_ops_stack.py` from 2.13, in
  `ops/array_ops.py` in 2.12.
- `cond` (`tf.cond`) is in `ops/cond.py` from 2.13, in
  `ops/control_flow_ops.py` in 2.12.
- The collective all-reduce of `IndexedSlices` across workers
  (`CollectiveReplicaLauncher.all_reduce_indexed_slices`) raises
  `RuntimeError` eagerly in 2.12 (TensorFlow pull request 53265 lifted
  that); it runs in a `tf.function` there.
"""

from tensorflow.python.distribute import cross_device_utils
from tensorflow.python.distribute import distribute_lib
from tensorflow.python.eager import tape as tape_module

if hasattr(distribute_lib, "get_strategy_and_replica_context"):
    strategy_context = distribute_lib
else:  # TensorFlow 2.12
    from tensorflow.python.distribute import distribution_strategy_context as strategy_context  # noqa: F401 (the alias is the export)

HAS_RESOLVER_REGISTRY = hasattr(tape_module, "register_watched_variable_resolver")
"""True from TensorFlow 2.13: native resolution is a registered hook."""

try:
    from tensorflow.python.ops.control_flow_assert import Assert as graph_assert
except ImportError:  # TensorFlow 2.12
    from tensorflow.python.ops.control_flow_ops import Assert as graph_assert  # noqa: F401 (the export)
"""`tf.debugging.Assert`: an op that raises InvalidArgumentError with its data
when its condition is false."""

try:
    from tensorflow.python.eager import record as recording_module
except ImportError:  # TensorFlow 2.12
    recording_module = tape_module
"""The module whose `record_operation` TensorFlow's callers call."""

stop_recording = recording_module.stop_recording
"""Context manager: no tape of this thread records inside it."""

try:
    from tensorflow.python.framework.tensor import Tensor
except ImportError:  # TensorFlow 2.12
    from tensorflow.python.framework.ops import Tensor  # noqa: F401 (the export)
"""`tf.Tensor`, graph and eager."""

try:
    from tensorflow.python.ops.array_ops_stack import stack
except ImportError:  # TensorFlow 2.12
    from tensorflow.python.ops.array_ops import stack  # noqa: F401 (the export)
"""`tf.stack`."""

try:
    from tensorflow.python.ops.cond import cond
except ImportError:  # TensorFlow 2.12
    from tensorflow.python.ops.control_flow_ops import cond  # noqa: F401 (the export)
"""`tf.cond`."""

EAGER_SPARSE_ALL_REDUCE = (
    "all_reduce_indexed_slices is not supported in eager mode." not in
    cross_device_utils.CollectiveReplicaLauncher.all_reduce_indexed_slices.__code__.co_consts)
"""Whether MultiWorkerMirroredStrategy all-reduces `IndexedSlices` eagerly
(False in 2.12: its launcher raises there, only a `tf.function` may)."""
