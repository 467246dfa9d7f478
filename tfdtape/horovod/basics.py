"""The process's place in a Horovod-style job, and the engine under it.

`init()` finds the job where its launcher put it (`tfdtape.launchers`:
`tfdtape launch`, a TF_CONFIG of a scheduler's or the user's own, Slurm's
srun, Open MPI's mpirun, MPICH's mpiexec). With several processes it starts TensorFlow's collective
runtime over gRPC by creating a MultiWorkerMirroredStrategy, whose
collectives (one allocator of group and instance keys for everything) every
operation of `tfdtape.horovod` issues on this process's one device. With
none, the job is this process alone: size 1, every collective the identity.

Ranks, local ranks and sizes are the launcher's (TF_CONFIG's chief is rank
0); cross ranks come from the cluster's host names.
"""

import dataclasses
import os
import threading

import tensorflow as tf
from tensorflow.python.eager import context

from tfdtape import errors
from tfdtape import launchers
from tfdtape import process_job
from tfdtape.launchers import tensorflow_job
from tfdtape.launchers import tf_config

_lock = threading.Lock()
_state = None  # The Job once init() ran, until shutdown().
_joined = None  # The Job joined first: TensorFlow's runtime cannot leave it.


@dataclasses.dataclass(frozen=True)
class Job:
    """What `init()` found: this process's place and, with several
    processes, the strategy and launcher its collectives go through."""
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    strategy: object = None
    launcher: object = None  # TensorFlow's CollectiveReplicaLauncher
    device: str = ""


def init(comm=None):
    """Joins the job this process belongs to (once; later calls do nothing).

    Raises:
        NotImplementedError: `comm` (an MPI communicator).
        RuntimeError: this process sees several GPUs (one process per GPU:
            start it with `tfdtape launch`), or TensorFlow's runtime started
            before `init()` with several processes.
    """
    global _state, _joined
    if comm is not None:
        raise NotImplementedError(errors.message(
            "init() was given an MPI communicator", "tfdtape.horovod.init",
            "no comm (the job is every process the launcher started: mpirun's "
            "COMM_WORLD, srun's tasks, TF_CONFIG's chief and workers)",
            type(comm).__name__,
            "call hvd.init() without comm; for a job of some processes only, "
            "use process sets (hvd.ProcessSet)"))
    with _lock:
        if _joined is None:
            with context.eager_mode():  # though a TensorFlow 1 graph be the default here
                _joined = _join()
        _state = _joined
        process_job.register(process_job.ProcessJob(rank=_state.rank, size=_state.size))


def _join():
    found = launchers.find_job()
    if found is not None and found.task_type == "evaluator":
        raise RuntimeError(errors.message(
            "init() in TF_CONFIG's evaluator", "tfdtape.horovod.init",
            "a training process (TF_CONFIG's chief or a worker)",
            "task type evaluator", "Run the Horovod program in the chief and the "
            "workers; an evaluator evaluates checkpoints without hvd.init()"))
    if found is None:
        return Job(rank=0, size=1, local_rank=0, local_size=1, cross_rank=0,
                   cross_size=1)
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=tensorflow_job.resolver_of(found))
    except RuntimeError as error:
        raise RuntimeError(errors.message(
            "init() could not start TensorFlow's collectives between processes",
            "tfdtape.horovod.init",
            "init() before TensorFlow runs its first operation", str(error),
            "call hvd.init() right after importing TensorFlow, before building "
            "models or tensors")) from error
    extended = strategy.extended
    if len(extended.worker_devices) != 1:
        raise RuntimeError(errors.message(
            "a process of the job sees several devices", "tfdtape.horovod.init",
            "one device per process (a Horovod job runs one process per GPU)",
            ", ".join(extended.worker_devices),
            "start the job with `tfdtape launch`, which gives each process its "
            "own GPU, or set CUDA_VISIBLE_DEVICES per process"))
    hosts = [address.rsplit(":", 1)[0] for address in found.addresses]
    host_order = list(dict.fromkeys(hosts))
    cross_rank = tf_config.launcher_int(os.environ, "CROSS_RANK",
                                        host_order.index(hosts[found.rank]))
    cross_size = tf_config.launcher_int(os.environ, "CROSS_SIZE", len(host_order))
    return Job(rank=found.rank, size=found.size, local_rank=found.local_rank,
               local_size=found.local_size, cross_rank=cross_rank,
               cross_size=cross_size, strategy=strategy,
               launcher=extended._cross_device_ops._launchers[0],
               device=extended.worker_devices[0])


def job():
    """The Job `init()` joined.

    Raises:
        ValueError: `init()` was not called (Horovod's own message names it).
    """
    state = _state
    if state is None:
        raise ValueError(errors.message(
            "tfdtape.horovod has not been initialized", "tfdtape.horovod",
            "hvd.init() before rank, size or a collective", "no init()",
            "call hvd.init() first"))
    return state


def shutdown():
    """Leaves the job: rank, size and the collectives refuse until `init()`
    (TensorFlow's collective runtime stays up, as it cannot be stopped in a
    running process: a later `init()` is in the same job again)."""
    global _state
    with _lock:
        _state = None
        process_job.register(None)


def is_initialized():
    return _state is not None


def size():
    return job().size


def rank():
    return job().rank


def local_size():
    return job().local_size


def local_rank():
    return job().local_rank


def cross_size():
    return job().cross_size


def cross_rank():
    return job().cross_rank


def _as_tensor(value, name):
    return tf.constant(value, tf.int32, name=name)


def rank_op(name=None):
    """`rank()` as an int32 tensor."""
    return _as_tensor(rank(), name)


def local_size_op(name=None):
    """`local_size()` as an int32 tensor."""
    return _as_tensor(local_size(), name)


def local_rank_op(name=None):
    """`local_rank()` as an int32 tensor."""
    return _as_tensor(local_rank(), name)


def is_homogeneous():
    """Whether every host runs as many processes (Horovod's question)."""
    state = job()
    return state.size == state.local_size * state.cross_size


def mpi_threads_supported():
    return False


def mpi_enabled():
    return False


def mpi_built():
    return False


def gloo_enabled():
    return False


def gloo_built():
    return False


def nccl_built():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def cuda_built():
    return tf.test.is_built_with_cuda()


def rocm_built():
    return tf.test.is_built_with_rocm()
