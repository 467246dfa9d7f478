"""The job Open MPI's `mpirun` started (Kubeflow's MPIJob, SageMaker's MPI
distribution, horovodrun --mpi): ranks from OMPI_COMM_WORLD_*. On one host
each process's port is derived from the job's PMIx namespace; across hosts
the addresses are exchanged over MPI (`mpi_addresses`).
This module must not import TensorFlow."""

from tfdtape.launchers import mpi_addresses

LAUNCHER = "Open MPI (mpirun)"

RANK, SIZE = "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"
"""The variables of this process's rank and of the number of processes."""
VARIABLES = (RANK, SIZE, "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")


def read(environ):
    """The LauncherJob of this Open MPI process; None outside a launch of
    several processes.

    Raises:
        JobFormationError: processes on several hosts without mpi4py.
    """
    if SIZE not in environ:
        return None
    namespace = environ.get("PMIX_NAMESPACE") or environ.get("OMPI_MCA_ess_base_jobid")
    return mpi_addresses.job_of(LAUNCHER, environ, VARIABLES,
                                lambda: namespace and f"open-mpi-{namespace}")
