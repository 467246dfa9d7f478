"""Every process's host:port, exchanged through MPI itself (mpi4py, the
optional extra `tfdtape[mpi]`) where an MPI launcher started processes on
several hosts and says nothing of their addresses.
This module must not import TensorFlow."""

import socket

from tfdtape.launchers import job as job_lib

EXTRA = 'pip install "tfdtape[mpi]"'

_exchanged = {}  # (launcher, rank, size): the addresses, exchanged once


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
