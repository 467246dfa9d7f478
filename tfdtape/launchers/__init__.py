"""The one reading of the job a launcher started this process in, used by
`tfdtape.horovod.init()`, `keras.distribution.initialize()`, a
MultiWorkerMirroredStrategy created without a cluster resolver, and
`tfdtape info`.

One module per launcher reads its environment: `tf_config` (`tfdtape
launch`, Kubeflow's TFJob, Ray Train, a program's own TF_CONFIG), `open_mpi`,
`mpich` (and Intel MPI), `slurm`; `mpi_addresses` exchanges addresses over
MPI where a launcher names none. A launch of several processes is one job
or every process raises `JobFormationError`: never a silent split into jobs
of one. `TFDTAPE_INDEPENDENT_PROCESSES=1` makes each process a job of its
own. This package must not import TensorFlow (`launchers.tensorflow_job`
does, and only it).
"""

import os

from tfdtape import errors
from tfdtape import switches
from tfdtape.launchers import job as job_lib
from tfdtape.launchers import mpich
from tfdtape.launchers import open_mpi
from tfdtape.launchers import slurm
from tfdtape.launchers import tf_config
from tfdtape.launchers.job import JobFormationError
from tfdtape.launchers.job import LauncherJob

__all__ = ["JobFormationError", "LauncherJob", "find_job"]


def find_job(environ=None):
    """The LauncherJob of this process (`environ`: default os.environ), or
    None for a process alone: no launcher, a launch of one process, or
    TFDTAPE_INDEPENDENT_PROCESSES set. TF_CONFIG comes first; an MPI
    launcher's processes next, as Slurm's step when both name the same
    processes (srun starting MPI), else as MPI's (mpirun inside an
    allocation).

    Raises:
        JobFormationError: a launch of several processes that cannot be one
            job, or TFDTAPE_INDEPENDENT_PROCESSES set where TF_CONFIG names
            a job (TensorFlow forms that one whatever tfdtape reads).
        ValueError: TF_CONFIG that cannot be read, or the switch's value.
    """
    environ = os.environ if environ is None else environ
    independent = switches.read(
        switches.INDEPENDENT_PROCESSES, False,
        f"Set {switches.INDEPENDENT_PROCESSES}=1 for processes that are jobs of "
        "their own, or unset it", environ)
    configured = tf_config.read(environ)
    if configured is not None:
        if independent and configured.size > 1:
            raise JobFormationError(errors.message(
                "separate jobs asked for where TF_CONFIG names one job",
                job_lib.SYMBOL, "no TF_CONFIG of several processes",
                f"TF_CONFIG naming {configured.size} processes",
                f"Unset {switches.INDEPENDENT_PROCESSES}, or TF_CONFIG"))
        return configured
    if independent or environ.get("TF_CONFIG"):
        return None
    step = slurm.read(environ)
    for engine in (open_mpi, mpich):
        if _names_processes(engine, environ):
            if step is not None and _same_processes(engine, environ, step):
                return step
            return engine.read(environ)
    return step


def _names_processes(engine, environ):
    """Whether `engine`'s variables say this is one of several processes
    (read without exchanging anything)."""
    return environ.get(engine.SIZE, "1").strip() not in ("", "0", "1")


def _same_processes(engine, environ, step):
    return (environ.get(engine.RANK), environ.get(engine.SIZE)) == (str(step.rank),
                                                                     str(step.size))
