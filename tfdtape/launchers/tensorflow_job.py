"""A launcher's job as TensorFlow takes it: the cluster resolver of its
processes, the GPU each process sees, and MultiWorkerMirroredStrategy's
default resolver (the patch target `make_strategy_init` makes). The one
module of `tfdtape.launchers` that imports TensorFlow."""

import functools
import os
import socket

from tensorflow.python.distribute.cluster_resolver import tfconfig_cluster_resolver
from tensorflow.python.eager import context
from tensorflow.python.training import server_lib

from tfdtape import errors
from tfdtape import launchers
from tfdtape import switches
from tfdtape.launchers import job as job_lib
from tfdtape.launchers import slurm_requeue
from tfdtape.launchers import tf_config


class LauncherClusterResolver(tfconfig_cluster_resolver.TFConfigClusterResolver):
    """The cluster of a launcher's job (Slurm, MPI), answering as a
    TF_CONFIG of it would: MultiWorkerMirroredStrategy treats it as
    TensorFlow's own TF_CONFIG resolver (the local GPUs counted alike)."""

    def __init__(self, job):
        super().__init__(task_type=job.task_type, task_id=job.task_index,
                         rpc_layer="grpc")
        self.job = job

    def cluster_spec(self):
        return server_lib.ClusterSpec(self.job.cluster())


def resolver_of(job):
    """TensorFlow's resolver of `job` (several processes): TF_CONFIG's own
    where TF_CONFIG describes it, else a LauncherClusterResolver. Makes the
    job's GPU for this process the only one visible first, while the
    runtime has not started, and arms Slurm's requeue on its time-limit
    signal (`slurm_requeue`)."""
    if job.launcher in tf_config.LAUNCHERS:
        return tfconfig_cluster_resolver.TFConfigClusterResolver()
    if not _runtime_started():  # else its server is up already, or it fails below
        _check_port_free(job)
    _show_only_the_jobs_gpus(job)
    slurm_requeue.arm(job)
    return LauncherClusterResolver(job)


def _runtime_started():
    return context.context()._context_handle is not None


def _check_port_free(job):
    """Refuses a derived port another program listens on, on this host
    (TensorFlow's server would fail to start with a message naming no port).

    Raises:
        JobFormationError: the port is taken.
    """
    port = int(job.addresses[job.rank].rsplit(":", 1)[1])
    with socket.socket() as probe:
        # As gRPC binds: connections of an earlier attempt's server, still
        # in TIME_WAIT on the port (a requeued job's), do not hold it.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError as error:
            raise job_lib.refusal(
                job.launcher, f"port {port} free on this host for process {job.rank} "
                f"({job.origin})", f"it taken ({error.strerror})",
                "Start the job again: another job id gives other ports (the job's "
                "other processes wait for this one until the launcher ends them: "
                "srun --kill-on-bad-exit=1 ends them at once)") from None


def _show_only_the_jobs_gpus(job):
    """CUDA_VISIBLE_DEVICES as the launcher's job gives this process (one
    GPU, as `tfdtape launch` gives), unless TensorFlow's runtime has started
    (its devices are fixed then) or the launcher named none."""
    if job.gpus is None or _runtime_started():
        return
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(job.gpus)


STARTED_TOO_LATE = "must be configured at program startup"
"""TensorFlow's words when collectives are set up after its runtime started."""


def make_strategy_init(original):
    """Returns a MultiWorkerMirroredStrategy `__init__` whose default
    resolver, where no TF_CONFIG is set, is the job the launcher started."""

    @functools.wraps(original)
    def __init__(self, cluster_resolver=None, communication_options=None):
        """TensorFlow's constructor. Without a cluster resolver and without
        TF_CONFIG, in a process that Slurm's srun or MPI's mpirun started
        with others, the strategy spans every process of that launch
        (`tfdtape.launchers.find_job`), as TF_CONFIG would make it; where
        they cannot be one job, JobFormationError on every process; after
        TensorFlow's runtime started (too late to join them), RuntimeError
        naming the launch."""
        found = None
        if cluster_resolver is None and not os.environ.get("TF_CONFIG"):
            found = launchers.find_job()
            if found is not None and found.size > 1:
                cluster_resolver = resolver_of(found)
        try:
            original(self, cluster_resolver, communication_options)
        except RuntimeError as error:
            if found is None or STARTED_TOO_LATE not in str(error):
                raise
            raise RuntimeError(errors.message(
                f"MultiWorkerMirroredStrategy() in a job of {found.size} processes "
                f"{found.launcher} started, after TensorFlow's runtime started",
                "tf.distribute.MultiWorkerMirroredStrategy",
                "the strategy created before any TensorFlow operation (its "
                "collectives are set up when the runtime starts)",
                "TensorFlow's runtime running", "Create the strategy first thing in "
                "the program; if each process is meant to be a job of its own, set "
                f"{switches.INDEPENDENT_PROCESSES}=1")) from error

    return __init__
