"""The job Open MPI's `mpirun` started (Kubeflow's MPIJob, SageMaker's MPI
distribution, horovodrun --mpi): ranks from OMPI_COMM_WORLD_*. On one host
each process's port is derived from the job's PMIx namespace; across hosts
the addresses are exchanged over MPI (`mpi_addresses`).
This module must not import TensorFlow."""

from tfdtape.launchers import job as job_lib
from tfdtape.launchers import mpi_addresses

LAUNCHER = "Open MPI (mpirun)"

RANK, SIZE = "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"
"""The variables of this process's rank and of the number of processes."""


def read(environ):
    """The LauncherJob of this Open MPI process; None outside a launch of
    several processes.

    Raises:
        JobFormationError: processes on several hosts without mpi4py.
    """
    if SIZE not in environ:
        return None
    size = job_lib.integer(environ, SIZE, LAUNCHER)
    if size < 2:
        return None
    rank = job_lib.integer(environ, RANK, LAUNCHER)
    local_rank = job_lib.integer(environ, "OMPI_COMM_WORLD_LOCAL_RANK", LAUNCHER)
    local_size = job_lib.integer(environ, "OMPI_COMM_WORLD_LOCAL_SIZE", LAUNCHER)
    namespace = environ.get("PMIX_NAMESPACE") or environ.get("OMPI_MCA_ess_base_jobid")
    if local_size == size and namespace:
        base = job_lib.derived_base_port(f"open-mpi-{namespace}", size)
        addresses = tuple(f"127.0.0.1:{base + index}" for index in range(size))
        origin = f"one host, ports from namespace {namespace}"
    else:
        addresses = mpi_addresses.exchange(LAUNCHER, rank, size)
        origin = "addresses exchanged over MPI"
    return job_lib.LauncherJob(LAUNCHER, rank, size, local_rank, local_size, addresses,
                               task_index=rank, origin=origin)
