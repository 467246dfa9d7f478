"""What MPI launchers share: the job of their variables (`job_of`), its
processes on one host at ports derived from the launch's id, else at
addresses exchanged through MPI itself (mpi4py, the optional extra
`tfdtape[mpi]`): MPI says nothing of them.
This module must not import TensorFlow."""

import socket

from tfdtape.launchers import job as job_lib

EXTRA = 'pip install "tfdtape[mpi]"'

_exchanged = {}  # (launcher, rank, size): the addresses, exchanged once


def job_of(launcher, environ, variables, one_host_key):
    """The LauncherJob an MPI launcher's `variables` (the names of the
    rank's, size's, local rank's and local size's) describe; None for a
    launch of one process. On one host the ports follow from
    `one_host_key()`, the launch's id there (None where unknown: the
    addresses are exchanged then).

    Raises:
        JobFormationError: a variable that is no integer; processes on
            several hosts (or no id) without mpi4py.
    """
    rank_name, size_name, local_rank_name, local_size_name = variables
    size = job_lib.integer(environ, size_name, launcher)
    if size < 2:
        return None
    rank = job_lib.integer(environ, rank_name, launcher)
    local_rank = job_lib.integer(environ, local_rank_name, launcher)
    local_size = job_lib.integer(environ, local_size_name, launcher)
    key = one_host_key() if local_size == size else None
    if key:
        base = job_lib.derived_base_port(key, size)
        addresses = tuple(f"127.0.0.1:{base + index}" for index in range(size))
        origin = f"one host, ports from {key}"
    else:
        addresses = exchange(launcher, rank, size)
        origin = "addresses exchanged over MPI"
    return job_lib.LauncherJob(launcher, rank, size, local_rank, local_size, addresses,
                               task_index=rank, origin=origin)


def exchange(launcher, rank, size):
    """Every process's host:port by rank: this host's name and a port free
    on it now, all-gathered over MPI's COMM_WORLD once per process (every
    later call gives the same addresses without communicating).

    Raises:
        JobFormationError: mpi4py is not installed, or its COMM_WORLD is
            not the launcher's job.
    """
    key = (launcher, rank, size)
    if key in _exchanged:
        return _exchanged[key]
    try:
        from mpi4py import MPI
    except ImportError:
        raise job_lib.refusal(
            launcher, "mpi4py, to exchange the processes' addresses (they run "
            "on several hosts and the launcher names none)", "no module mpi4py",
            f"Install MPI's Python binding: {EXTRA}") from None
    world = MPI.COMM_WORLD
    if (world.Get_rank(), world.Get_size()) != (rank, size):
        raise job_lib.refusal(
            launcher, f"MPI's COMM_WORLD as process {rank} of {size}",
            f"process {world.Get_rank()} of {world.Get_size()}",
            "Start the program with the mpirun of the MPI mpi4py was built for")
    with socket.socket() as probe:
        probe.bind(("", 0))
        port = probe.getsockname()[1]
    _exchanged[key] = tuple(world.allgather(f"{socket.gethostname()}:{port}"))
    return _exchanged[key]
