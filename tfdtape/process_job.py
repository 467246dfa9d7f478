"""The job of processes this one trains in outside `tf.distribute`'s
strategies: a `tfdtape.horovod` job, which registers itself when it joins
(`hvd.init()`) and leaves when it shuts down. What the library needs of it
(`tfdtape.keras3_saving`: which process writes the job's files) it reads
here, without importing `tfdtape.horovod`."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class ProcessJob:
    """This process's place in a job of several processes."""
    rank: int
    size: int


_current = None


def register(job):
    """Makes `job` (a ProcessJob, or None: no job) the current one."""
    global _current
    _current = job


def current():
    """The job this process trains in, or None."""
    return _current
