"""The job MPICH's or Intel MPI's Hydra `mpiexec` started: ranks from
PMI_RANK and PMI_SIZE. On one host each process's port is derived from the
Hydra proxy that started the processes (their common ancestor); otherwise
the addresses are exchanged over MPI (`mpi_addresses`).
This module must not import TensorFlow."""

import os

from tfdtape.launchers import job as job_lib
from tfdtape.launchers import mpi_addresses

LAUNCHER = "MPICH / Intel MPI (mpiexec)"

PROXY = "hydra_pmi_proxy"
"""The process Hydra starts on each host, parent of that host's ranks."""

RANK, SIZE = "PMI_RANK", "PMI_SIZE"
"""The variables of this process's rank and of the number of processes."""


def read(environ):
    """The LauncherJob of this Hydra process; None outside a launch of
    several processes.

    Raises:
        JobFormationError: processes on several hosts (or no Hydra proxy
            found) without mpi4py.
    """
    if SIZE not in environ or RANK not in environ:
        return None
    size = job_lib.integer(environ, SIZE, LAUNCHER)
    if size < 2:
        return None
    rank = job_lib.integer(environ, RANK, LAUNCHER)
    local_rank = job_lib.integer(environ, "MPI_LOCALRANKID", LAUNCHER)
    local_size = job_lib.integer(environ, "MPI_LOCALNRANKS", LAUNCHER)
    proxy = hydra_proxy() if local_size == size else None
    if proxy is not None:
        base = job_lib.derived_base_port(f"hydra-{proxy}", size)
        addresses = tuple(f"127.0.0.1:{base + index}" for index in range(size))
        origin = f"one host, ports from Hydra's proxy {proxy}"
    else:
        addresses = mpi_addresses.exchange(LAUNCHER, rank, size)
        origin = "addresses exchanged over MPI"
    return job_lib.LauncherJob(LAUNCHER, rank, size, local_rank, local_size, addresses,
                               task_index=rank, origin=origin)


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
