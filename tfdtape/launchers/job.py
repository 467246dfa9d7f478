"""What a launcher tells a process of the job it started: `LauncherJob`,
and the one error every process of a job that cannot be formed raises.
This module must not import TensorFlow."""

import dataclasses
import zlib

from tfdtape import errors
from tfdtape import switches

PORT_RANGE = (20000, 32768)
"""Where ports derived from a launcher's job id fall: below Linux's
ephemeral range (32768 and up by default), where the kernel does not hand
out ports of outgoing connections. Each process checks its own port free
before TensorFlow's server binds it (`tensorflow_job`)."""

SYMBOL = "tfdtape.launchers.find_job"
"""The symbol tfdtape's messages about a launcher's job name."""


class JobFormationError(RuntimeError):
    """A launcher started several processes and tfdtape cannot make them
    one job. Every process of the launch raises it alike, from the same
    environment, before any of them waits for the others."""

    __init__ = Exception.__init__


@dataclasses.dataclass(frozen=True)
class LauncherJob:
    """This process's place in the job its launcher started.

    `addresses` holds every training process's host:port by rank, the
    cluster TensorFlow's collectives connect; `task_type` and `task_index`
    name this process in it (TF_CONFIG's chief is rank 0, its workers
    follow). `gpus` is what this process should make visible
    (CUDA_VISIBLE_DEVICES' form), None where the launcher did not say.
    `origin` says where the launcher's facts came from, for `tfdtape info`.
    """
    launcher: str
    rank: int
    size: int
    local_rank: int
    local_size: int
    addresses: tuple
    task_type: str = "worker"
    task_index: int = 0
    gpus: tuple = None
    origin: str = ""
    chiefs: int = 0

    def cluster(self):
        """{task type: [host:port, ...]} as TensorFlow's ClusterSpec takes it:
        the first `chiefs` addresses are chiefs, the rest workers."""
        tasks = {"worker": list(self.addresses[self.chiefs:])}
        if self.chiefs:
            tasks["chief"] = list(self.addresses[:self.chiefs])
        return tasks

    def describe(self):
        """One line for `tfdtape info`."""
        return (f"{self.launcher}: process {self.rank} of {self.size} (local "
                f"{self.local_rank} of {self.local_size}), workers "
                f"{', '.join(self.addresses)}"
                + (f"; GPUs {','.join(self.gpus) or 'none'}" if self.gpus is not None else "")
                + (f" ({self.origin})" if self.origin else ""))


def refusal(launcher, expected, found, remedy):
    """The JobFormationError of a launch of several processes that cannot
    be one job, in tfdtape's message shape, naming the switch for separate
    jobs."""
    return JobFormationError(errors.message(
        f"{launcher} started several processes and they cannot be made one job",
        SYMBOL, expected, found,
        f"{remedy.rstrip('.')}; if each process is meant to be a job of its own "
        f"(a sweep), set {switches.INDEPENDENT_PROCESSES}=1"))


def derived_base_port(job_key, width):
    """The first of `width` consecutive ports for a job named `job_key`:
    the same on every process of the job, different for two jobs on a host
    but by a rare collision of the key's checksum."""
    low, high = PORT_RANGE
    slots = (high - low) // max(width, 1)
    return low + zlib.crc32(job_key.encode()) % slots * max(width, 1)


def integer(environ, name, launcher):
    """The integer environment variable `name` the launcher set.

    Raises:
        JobFormationError: it is not an integer.
    """
    raw = environ.get(name, "")
    try:
        return int(raw)
    except ValueError:
        raise refusal(launcher, f"{name} an integer", f"{name}={raw!r}",
                      f"Leave {name} as {launcher} sets it") from None
