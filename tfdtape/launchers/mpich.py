"""The job MPICH's or Intel MPI's Hydra `mpiexec` started: ranks from
PMI_RANK and PMI_SIZE. On one host each process's port is derived from the
Hydra proxy that started the processes (their common ancestor); otherwise
the addresses are exchanged over MPI (`mpi_addresses`).
This module must not import TensorFlow."""

import os

from tfdtape.launchers import mpi_addresses

LAUNCHER = "MPICH / Intel MPI (mpiexec)"

PROXY = "hydra_pmi_proxy"
"""The process Hydra starts on each host, parent of that host's ranks."""

RANK, SIZE = "PMI_RANK", "PMI_SIZE"
"""The variables of this process's rank and of the number of processes."""
VARIABLES = (RANK, SIZE, "MPI_LOCALRANKID", "MPI_LOCALNRANKS")


def read(environ):
    """The LauncherJob of this Hydra process; None outside a launch of
    several processes.

    Raises:
        JobFormationError: processes on several hosts (or no Hydra proxy
            found) without mpi4py.
    """
    if SIZE not in environ or RANK not in environ:
        return None

    def proxy_key():
        proxy = hydra_proxy()
        return None if proxy is None else f"hydra-{proxy}"

    return mpi_addresses.job_of(LAUNCHER, environ, VARIABLES, proxy_key)


def hydra_proxy():
    """The process id of this process's nearest ancestor that is Hydra's
    proxy (Linux's /proc), or None."""
    pid = os.getppid()
    for _ in range(16):
        if pid <= 1:
            return None
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as stat:
                fields = stat.read()
        except OSError:
            return None
        name = fields[fields.index("(") + 1:fields.rindex(")")]
        if name == PROXY[:15]:  # the kernel keeps 15 characters of a name
            return pid
        pid = int(fields[fields.rindex(")") + 2:].split()[1])
    return None
