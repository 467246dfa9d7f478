"""Keras 3's distribution API (`keras.distribution`) on TensorFlow's engine.

Keras 3 ships its TensorFlow distribution backend as a stub ("DO NOT USE";
`distribute_value` is a TODO): on the TensorFlow backend
`keras.distribution.set_distribution(DataParallel(...))` is accepted and
then ignored, and `fit` trains on one device with plain variables.
`keras.distribution.initialize()` fails there (the backend module has no
`initialize`). tfdtape maps the API onto `tf.distribute`:

- `set_distribution(DataParallel)` (and `distribution.scope()`, which calls
  it) makes a MirroredStrategy over the distribution's devices the global
  strategy (`tf.distribute.experimental_set_strategy`): models built and
  compiled afterwards get mirrored variables, and Keras's TensorFlow trainer
  runs `fit`, `evaluate` and `predict` on every device (with tfdtape's own
  Keras training paths). One strategy serves each list of devices for the
  life of the process, so a model built under one `scope()` trains under
  the next. `set_distribution(None)` puts back no strategy.
- `initialize()` (its arguments, Keras's KERAS_DISTRIBUTION_* variables, or
  the job its launcher started: `tfdtape launch`, a scheduler's TF_CONFIG,
  Slurm's srun, MPI's mpirun; `tfdtape.launchers`) starts the job's
  MultiWorkerMirroredStrategy; a DataParallel then runs on it, marked with
  the job's processes, so Keras shards a `tf.data` dataset of global
  batches as it does on JAX (each process its share of every batch; none
  with `auto_shard_dataset=False`), and Keras's TensorFlow data adapter
  hands each process's batches to its replicas
  (`distribute_datasets_from_function`) instead of splitting them again
  as global batches.
- What TensorFlow's engine cannot do here is refused where it is set, on
  every process alike: any other `Distribution` (`ModelParallel`, layouts
  that shard variables), a mesh of more than one axis, devices this process
  does not have, a job of several processes without `initialize()`.
- A model built before the distribution was set (its variables on one
  device) is refused when it trains under it (`check_model`).

Another backend, or no Keras 3 `keras.distribution`, is left alone; Keras
is never imported here.
"""

import functools
import json
import os
import sys
import types

from tensorflow.python.data.experimental.ops import distribute as tf_data_distribute
from tensorflow.python.data.ops import dataset_ops
from tensorflow.python.distribute import collective_all_reduce_strategy
from tensorflow.python.distribute import distribute_lib
from tensorflow.python.distribute import mirrored_strategy
from tensorflow.python.distribute.cluster_resolver import cluster_resolver as resolvers
from tensorflow.python.eager import context
from tensorflow.python.framework import config as tf_config
from tensorflow.python.framework import device as device_lib
from tensorflow.python.framework import ops
from tensorflow.python.ops import array_ops
from tensorflow.python.training import server_lib
from tensorflow.python.types import distribute as distribute_types
from tensorflow.python.util import nest

from tfdtape import errors
from tfdtape import events
from tfdtape import keras_variables
from tfdtape import launchers
from tfdtape import process_state
from tfdtape import resolution
from tfdtape.launchers import tensorflow_job

DEFINING_MODULE = "keras.src.distribution.distribution_lib"
"""Where Keras 3 defines its distribution API (watched for by
`tfdtape.late_imports`)."""
API_MODULES = (DEFINING_MODULE, "keras.src.distribution", "keras.distribution",
               "keras._tf_keras.keras.distribution")
"""The modules that hold Keras's `set_distribution` and `initialize`."""
SET_ATTRIBUTE = "set_distribution"
SET_PARAMETERS = ("value",)
INITIALIZE_ATTRIBUTE = "initialize"
INITIALIZE_PARAMETERS = ("job_addresses", "num_processes", "process_id")
ADAPTER_MODULE = "keras.src.trainers.data_adapters.tf_dataset_adapter"
"""Where Keras 3 defines its TensorFlow data adapter (watched for by
`tfdtape.late_imports`)."""
ADAPTER_ATTRIBUTE = "get_tf_dataset"
ADAPTER_PARAMETERS = ("self",)
ADAPTER_INIT = ("__init__", ("self", "dataset", "class_weight", "distribution"))
_BACKEND_MODULE = "keras.src.backend.config"


def _new_state():
    """The strategies made for device lists ({canonical devices: strategy}),
    the job `initialize()` started (None: none), and the strategy tfdtape
    made global (None: none)."""
    return types.SimpleNamespace(strategies={}, job=None, global_strategy=None,
                                 lock=process_state.lock(reentrant=True))


_state = process_state.kept(globals(), "_state", _new_state)


def defining_module():
    """Keras 3's distribution module, if loaded; else None."""
    module = sys.modules.get(DEFINING_MODULE)
    if module is None or not isinstance(vars(module).get("Distribution"), type):
        return None
    return module


def modules_holding(attribute):
    """The loaded modules of API_MODULES that hold the defining module's
    `attribute` (or tfdtape's replacement of it, `is_replacement`)."""
    module = defining_module()
    if module is None or attribute not in vars(module):
        return []
    return [sys.modules[name] for name in API_MODULES if name in sys.modules
            and attribute in vars(sys.modules[name])]


def adapter_class():
    """Keras 3's `TFDatasetAdapter`, where its module and the distribution
    API are loaded; else None."""
    module = sys.modules.get(ADAPTER_MODULE)
    found = None if module is None else vars(module).get("TFDatasetAdapter")
    return found if isinstance(found, type) and defining_module() is not None else None


def _tensorflow_backend():
    config = sys.modules.get(_BACKEND_MODULE)
    return config is not None and config.backend() == "tensorflow"


def _refuse(failed, symbol, expected, found, remedy, kind=ValueError):
    return events.refused(kind(errors.message(failed, symbol, expected, found, remedy)))


_WHAT_WORKS = ("On TensorFlow use keras.distribution.DataParallel (tfdtape trains it "
               "through tf.distribute), or a tf.distribute strategy directly")


def make_set_distribution(original):
    """Returns a `set_distribution` that, on the TensorFlow backend, puts
    the strategy of a DataParallel (`strategy_for`) in place globally, and
    takes tfdtape's away for None; other distributions are refused."""

    @functools.wraps(original)
    def set_distribution(value):
        if not _tensorflow_backend():
            return original(value)
        with _state.lock:
            if not _settable(value):
                return original(value)
            strategy = None if value is None else strategy_for(value)
            if strategy is not _current_strategy():
                distribute_lib.experimental_set_strategy(strategy)
                _state.global_strategy = strategy
            return original(value)

    return set_distribution


def _current_strategy():
    return distribute_lib.get_strategy() if distribute_lib.has_strategy() else None


def _settable(value):
    """Whether tfdtape may make `value`'s strategy (None: none) global:
    False for None where no strategy of tfdtape's is global, or the
    program's own is (not tfdtape's to take away).

    Raises:
        RuntimeError: inside a `with strategy.scope():`, or over the
            program's own global strategy.
    """
    if value is None and _state.global_strategy is None:
        return False
    global_scope = ops.get_default_graph()._global_distribute_strategy_scope
    current = _current_strategy()
    if global_scope is None and current is not None:
        raise _refuse("keras.distribution.set_distribution inside a tf.distribute "
                      "scope", "keras.distribution.set_distribution",
                      "no `with strategy.scope():` around it",
                      f"inside {type(current).__name__}.scope()",
                      "Set the Keras distribution outside strategy scopes (it makes "
                      "its own strategy global)", RuntimeError)
    if global_scope is not None and current is not _state.global_strategy:
        if value is None:
            return False
        raise _refuse("keras.distribution.set_distribution over a global strategy",
                      "keras.distribution.set_distribution",
                      "no tf.distribute.experimental_set_strategy of the program's",
                      f"{type(current).__name__} set globally",
                      "Use either tf.distribute.experimental_set_strategy or "
                      "keras.distribution, not both", RuntimeError)
    return True


def strategy_for(distribution):
    """The tf.distribute strategy that trains `distribution`: the job's
    MultiWorkerMirroredStrategy when `initialize()` started one, else a
    MirroredStrategy over its devices (one per device list); marks the
    distribution with the job's processes.

    Raises:
        ValueError: a distribution TensorFlow's engine cannot train here.
    """
    name = type(distribution).__name__
    module = vars(defining_module())
    if not isinstance(distribution, module["DataParallel"]):
        what = ("variables laid out across devices"
                if isinstance(distribution, module.get("ModelParallel", ()))
                else "another Distribution" if isinstance(distribution, module["Distribution"])
                else "not a keras.distribution.Distribution")
        raise _refuse("a Keras distribution TensorFlow cannot train",
                      f"keras.distribution.{name}", "keras.distribution.DataParallel",
                      f"{name} ({what})", _WHAT_WORKS)
    mesh = distribution.device_mesh
    if len(mesh.shape) != 1:
        raise _refuse("a Keras distribution TensorFlow cannot train",
                      f"keras.distribution.{name}", "a device mesh of one (data) axis",
                      f"a mesh of shape {tuple(mesh.shape)} (axes {list(mesh.axis_names)})",
                      "Give DataParallel a list of devices or a 1-D mesh; sharding "
                      "along other axes has no TensorFlow engine here")
    names = [str(device) for device in mesh.devices.flatten()]
    job = _state.job if _state.job is not None else _job_from_environment()
    if job is None:
        devices = canonical_devices(names)
        strategy = _state.strategies.get(devices)
        if strategy is None:
            strategy = _state.strategies[devices] = mirrored_strategy.MirroredStrategy(
                list(devices))
        processes, process_id = 1, 0
    else:
        strategy, processes, process_id = job.strategy, job.processes, job.process_id
        _check_job_devices(name, names, strategy)
    distribution._num_processes = processes
    distribution._process_id = process_id
    distribution._is_multi_process = processes > 1
    return strategy


def _check_job_devices(name, names, strategy):
    """Refuses a DataParallel of a job whose devices are not every device
    the job's strategy trains on. Keras names the job's devices by type and
    index only (`list_devices()` gives "cpu:0" once per process), so their
    count and types are what can be compared."""
    kind = device_lib.DeviceSpec.from_string(
        strategy.extended.worker_devices[0]).device_type.lower()
    wanted = strategy.num_replicas_in_sync
    found_kinds = {device_lib.DeviceSpec.from_string(
        item if item.startswith("/") else f"/{item}").device_type.lower() for item in names}
    if len(names) != wanted or found_kinds != {kind}:
        raise _refuse("a Keras DataParallel over other devices than the job's",
                      f"keras.distribution.{name}",
                      f"the job's {wanted} {kind} device(s), one entry each "
                      "(keras.distribution.list_devices())", names,
                      "Use DataParallel() or DataParallel(devices=keras.distribution."
                      "list_devices()) in every process")


def _job_from_environment():
    """None for a process alone; refuses a launch of several processes
    (`tfdtape.launchers.find_job`) when `initialize()` did not start it."""
    found = launchers.find_job()
    if found is not None and found.size > 1:
        raise _refuse("a Keras distribution in a job of several processes before "
                      "keras.distribution.initialize()",
                      "keras.distribution.set_distribution",
                      "keras.distribution.initialize() first",
                      f"{found.describe()}",
                      "Call keras.distribution.initialize() at the start of every "
                      "process, before any TensorFlow computation")
    return None


def canonical_devices(names):
    """Device names (Keras's "cpu:0", "/gpu:1", full names) as full
    TensorFlow device names, in order.

    Raises:
        ValueError: a name that is no device of this process.
    """
    local = {_full_name(device.name) for device in tf_config.list_logical_devices()}
    found = []
    for name in names:
        try:
            full = _full_name(name if name.startswith("/") else f"/{name}")
        except ValueError:  # not a device name at all
            full = None
        if full not in local or full in found:
            raise _refuse("a Keras distribution over devices this process does not "
                          "have" if full not in local else "a Keras distribution naming "
                          "a device twice", "keras.distribution.DataParallel",
                          f"devices among {sorted(local)}, each once", repr(name),
                          "Use keras.distribution.list_devices()")
        found.append(full)
    return tuple(found)


def _full_name(name):
    spec = device_lib.DeviceSpec.from_string(name)
    if spec.job is None:
        spec = spec.replace(job="localhost", replica=0, task=0)
    return spec.to_string()


def make_initialize(original):
    """Returns an `initialize` that, on the TensorFlow backend, starts the
    job's MultiWorkerMirroredStrategy (`start_job`)."""

    @functools.wraps(original)
    def initialize(job_addresses=None, num_processes=None, process_id=None):
        if not _tensorflow_backend():
            return original(job_addresses, num_processes, process_id)
        environ = os.environ
        if job_addresses is None:
            job_addresses = environ.get("KERAS_DISTRIBUTION_JOB_ADDRESSES")
        if num_processes is None and "KERAS_DISTRIBUTION_NUM_PROCESSES" in environ:
            num_processes = int(environ["KERAS_DISTRIBUTION_NUM_PROCESSES"])
        if process_id is None and "KERAS_DISTRIBUTION_PROCESS_ID" in environ:
            process_id = int(environ["KERAS_DISTRIBUTION_PROCESS_ID"])
        with _state.lock:
            start_job(job_addresses, num_processes, process_id)

    return initialize


_SYMBOL_INITIALIZE = "keras.distribution.initialize"


def start_job(job_addresses, num_processes, process_id):
    """Starts the job's MultiWorkerMirroredStrategy: on the workers
    `job_addresses` names (comma-separated host:port, one per process), or
    the launcher's (`tfdtape.launchers.find_job`); a process alone starts
    nothing.

    Raises:
        ValueError: addresses, count and id that do not describe one job.
        JobFormationError: a launch of several processes that cannot be
            one job.
        RuntimeError: TensorFlow's runtime started before (collectives are
            set up when it starts), or another job was started.
    """
    if job_addresses:
        addresses = [address.strip() for address in job_addresses.split(",")]
        if num_processes is None:
            num_processes = len(addresses)
        if num_processes != len(addresses) or process_id is None or not (
                0 <= process_id < num_processes):
            raise _refuse("a job keras.distribution.initialize cannot start",
                          _SYMBOL_INITIALIZE,
                          "one host:port per process (TensorFlow connects every "
                          "process to every other), num_processes as many, and "
                          "0 <= process_id < num_processes",
                          f"job_addresses={job_addresses!r}, num_processes="
                          f"{num_processes}, process_id={process_id}",
                          "Pass every process's address, or run under `tfdtape "
                          "launch` (TF_CONFIG) and call initialize() without arguments")
        resolver = resolvers.SimpleClusterResolver(
            server_lib.ClusterSpec({"worker": addresses}), task_type="worker",
            task_id=process_id, rpc_layer="grpc")
        processes = num_processes
    else:
        found = launchers.find_job()
        if found is None or found.size < 2:
            return  # a process alone: nothing to start
        resolver = tensorflow_job.resolver_of(found)
        processes, process_id = found.size, found.rank
    cluster = resolver.cluster_spec().as_dict()
    key = (json.dumps(cluster, sort_keys=True), resolver.task_type, resolver.task_id)
    if _state.job is not None:
        if _state.job.key == key:
            return
        raise _refuse("a second job", _SYMBOL_INITIALIZE, "one job per process",
                      f"{key[0]} after {_state.job.key[0]}",
                      "Call keras.distribution.initialize() once, with the same job",
                      RuntimeError)
    if context.context()._context_handle is not None:
        raise _refuse("keras.distribution.initialize after TensorFlow's runtime "
                      "started", _SYMBOL_INITIALIZE,
                      "a call before any TensorFlow computation",
                      "the runtime running (collectives are set up when it starts)",
                      "Call keras.distribution.initialize() first thing in every "
                      "process", RuntimeError)
    strategy = collective_all_reduce_strategy.CollectiveAllReduceStrategy(
        cluster_resolver=resolver)
    _state.job = types.SimpleNamespace(strategy=strategy, processes=processes,
                                       process_id=process_id, key=key)


def make_get_tf_dataset(original):
    """Returns a `TFDatasetAdapter.get_tf_dataset` that, while a Keras
    distribution trains on the job's strategy of several processes, hands
    this process's batches (Keras's shard of the global batches, or the
    program's own with `auto_shard_dataset=False`) to its replicas as a
    distributed dataset, which Keras's trainer takes as it is."""

    @functools.wraps(original)
    def get_tf_dataset(self):
        dataset = original(self)
        job = _state.job
        distribution = None if job is None else defining_module().distribution()
        if (distribution is None or not getattr(distribution, "_is_multi_process", False)
                or _is_distributed_dataset(dataset)):
            return dataset
        return process_batches(job, dataset)

    return get_tf_dataset


def make_adapter_init(original):
    """Returns a `TFDatasetAdapter.__init__` that keeps the number of
    batches of a dataset Keras shards among the job's processes."""

    @functools.wraps(original)
    def __init__(self, dataset, class_weight=None, distribution=None):
        """Keras's adapter; where Keras sharded a dataset of N global
        batches (N known) among the job's processes, this process's shard
        holds N batches too, padded with empty ones as TensorFlow's
        partial-batch handling pads a process that runs out. Keras then
        knows each epoch's steps: with a shard of unknown length it runs one
        step more per epoch, which fails for want of data but has already
        counted the optimizer's iteration (Adam's bias correction moves)."""
        original(self, dataset, class_weight, distribution)
        sharded = getattr(self, "_dataset", None)
        if (_state.job is None or distribution is None or sharded is dataset
                or not getattr(distribution, "_is_multi_process", False)
                or not isinstance(dataset, dataset_ops.DatasetV2)
                or not isinstance(sharded, dataset_ops.DatasetV2)):
            return
        batches = int(dataset.cardinality())
        if batches >= 0 and int(sharded.cardinality()) < 0:
            self._dataset = padded_to(sharded, batches)

    return __init__


def padded_to(dataset, batches):
    """`dataset` (batched, at most `batches` batches) followed by empty
    batches, `batches` in all: a dataset whose cardinality is known."""

    def empty(spec):
        shape = [0, *(0 if size is None else size for size in spec.shape[1:])]
        return array_ops.zeros(shape, spec.dtype)

    nothing = dataset_ops.DatasetV2.from_tensors(
        nest.map_structure(empty, dataset.element_spec)).repeat()
    return dataset.concatenate(nothing).take(batches)


def _is_distributed_dataset(value):
    """Whether `value` is a `tf.distribute.DistributedDataset` (its class is
    in tensorflow/python/types/distribute.py from Keras 3's TensorFlow
    releases on; by module elsewhere)."""
    interface = getattr(distribute_types, "DistributedDatasetInterface", None)
    if interface is not None:
        return isinstance(value, interface)
    return type(value).__module__.startswith("tensorflow.python.distribute")


def process_batches(job, dataset):
    """`dataset`, this process's batches, as the job's distributed dataset:
    each step one batch, split among this process's replicas."""
    local_replicas = job.strategy.num_replicas_in_sync // job.processes
    if local_replicas > 1:
        batch = int(tf_data_distribute.compute_batch_size(dataset).numpy())
        if batch < 0 or batch % local_replicas:
            raise _refuse("a process's batches its replicas cannot split",
                          "keras.distribution.DataParallel",
                          f"a batch size known and divisible by {local_replicas}",
                          f"batch size {batch}", "Batch the dataset with a global batch "
                          "size divisible by every replica of the job")
        dataset = dataset.rebatch(batch // local_replicas)
    return job.strategy.distribute_datasets_from_function(lambda _: dataset)


def check_model(model):
    """Refuses to train `model` under tfdtape's global strategy when it was
    built before the Keras distribution was set (Keras's trainer would then
    take the global strategy with the model's variables on one device)."""
    strategy = _state.global_strategy
    if (strategy is None or getattr(model, "_distribute_strategy", strategy) is not None
            or not distribute_lib.has_strategy()
            or distribute_lib.get_strategy() is not strategy):
        return
    plain = [variable for variable in model.variables
             if not resolution.is_distributed_variable(_tf_variable(variable))]
    if plain:
        raise _refuse("a Keras model built before the Keras distribution was set",
                      f"model {model.name!r}",
                      f"variables made under it, on its {strategy.num_replicas_in_sync} "
                      "devices", f"{keras_variables.label(plain[0])} on one device",
                      "Build and compile the model after "
                      "keras.distribution.set_distribution(...), or inside `with "
                      "distribution.scope():`")


def _tf_variable(variable):
    """The tf.Variable a Keras variable holds, or `variable` itself."""
    inner = keras_variables.inner_or_none(variable)
    return variable if inner is None else inner
