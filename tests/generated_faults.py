"""Generated faults and their oracle (tests/test_generated_faults.py).

A seed draws cases from a small grammar: a job (its script under `tfdtape
launch`, with the options it draws) × where each fault lands
(tests/fault_points.py's moments, at an epoch) × its victim (the chief, a
worker, both; one inside a collective) × its way (exit, SIGKILL, SIGTERM) ×
faults per job (1 or 2, the second on the restarted attempt). The oracle
knows nothing of tfdtape: the job run uninterrupted.
Every drawn fault is reached (its epoch at or after the epoch its attempt
resumes at). A faulted job, launched with one restart per fault, restarts
once per fault and ends with every process at 0, the uninterrupted job's
variables on every rank bitwise, the same files in its directory, nothing
half-written left, and its last attempt training exactly the epochs after
the last whole backup (none where the last fault came after training).

The jobs:

    fit      Keras 3 `fit` under MultiWorkerMirroredStrategy with the
             tutorial's callbacks (BackupAndRestore, two ModelCheckpoints)
             and model.save, save_weights, export on one shared directory
             (tests/keras_saving_process.py)
    loop     a custom loop with the tape around `strategy.run` and
             `tf.train.CheckpointManager` (tests/checkpoint_loop_process.py)
    horovod  Horovod's Keras checkpoint pattern: rank 0 checkpoints every
             epoch, the restarted job resumes from rank 0's last one
             (tests/horovod_scripts/checkpoint_resume.py); with or without
             SyncBatchNormalization
    elastic  Horovod's elastic API, `fit` with its callbacks or a custom
             loop with DistributedGradientTape, a commit per epoch
             (tests/horovod_scripts/elastic_training.py); with or without
             SyncBatchNormalization, and process sets (on 4 processes: two
             copies of the job, each in a process set of its own)

Horovod's checkpoint pattern takes no process set: `hvd.load_model` makes
rank 0's DistributedOptimizer for the global set, so a set would differ
between rank 0 and the others; the elastic job carries the sets.
"""

import dataclasses
import random

import fault_points

EPOCHS = 4
JOBS = ("fit", "loop", "horovod", "elastic")
MOMENTS_OF = {"fit": ("batch", "collective", "save", "restore", "after"),
              "loop": ("batch", "collective", "save", "restore", "after"),
              "horovod": ("batch", "collective", "restore", "after"),
              "elastic": ("batch", "collective", "restore", "after")}
"""The moments each job's script offers (Horovod's pattern writes its
checkpoints through Keras's ModelCheckpoint on rank 0, and elastic's
commits are tfdtape's, both written whole: no half-written backup of the
script's own to die in)."""
VICTIMS = ((0,), (1,), (0, 1))
ALONE = ((0,), (1,))
"""The victims inside a collective: one, whom the others are late for."""


@dataclasses.dataclass(frozen=True)
class Fault:
    attempt: int
    victims: tuple
    moment: str
    epoch: int
    way: str


@dataclasses.dataclass(frozen=True)
class Case:
    index: int
    job: str
    faults: tuple
    arguments: tuple = ()  # the job script's options (restart_jobs.launch)
    processes: int = 2

    def environment(self):
        """FAULTS for the launch (tests/fault_points.py)."""
        return ",".join(fault_points.spec(f.attempt, rank, f.moment, f.epoch, f.way)
                        for f in self.faults for rank in f.victims)

    def restarts(self):
        return len(self.faults)

    def resumed_epochs(self):
        """The epochs the last attempt trains: from the epoch after the last
        whole backup (a fault in batch 1 of epoch E or inside epoch E's
        backup leaves epoch E-1's; one after training leaves the end)."""
        return list(range(_resume_epoch(self.faults), EPOCHS))

    def describe(self):
        return f"case {self.index} ({' '.join((self.job, *self.arguments))} on " \
               f"{self.processes}; " + "; ".join(
            f"attempt {f.attempt}: rank {'+'.join(map(str, f.victims))} {f.way} at "
            f"{f.moment}" + ("" if f.epoch == fault_points.ANY_EPOCH else f" of epoch {f.epoch}")
            for f in self.faults) + ")"


def draw(seed, count):
    """`count` cases; the jobs taken in turn, so every job is in any three."""
    rng = random.Random(seed)
    return [_case(rng, index, JOBS[index % len(JOBS)]) for index in range(count)]


def _resume_epoch(faults):
    resume = 0
    for fault in faults:
        if fault.moment in ("batch", "collective", "save"):
            resume = fault.epoch
        elif fault.moment == "after":
            resume = EPOCHS
    return resume


def _case(rng, index, job):
    faults = [_fault(rng, job, 0, resume=0)]
    if rng.random() < 0.5 and faults[0].moment != "after":
        faults.append(_fault(rng, job, 1, resume=_resume_epoch(faults)))
    arguments, processes = _options(rng, job)
    return Case(index, job, tuple(faults), arguments, processes)


def _options(rng, job):
    """(the script's options, processes) drawn for `job`."""
    if job == "horovod":
        return (("--sync-bn",) if rng.random() < 0.5 else ()), 2
    if job != "elastic":
        return (), 2
    sets = rng.random() < 0.5
    return ((rng.choice(("fit", "loop")),) + (("--process-set",) if sets else ())
            + (("--sync-bn",) if rng.random() < 0.5 else ())), 4 if sets else 2


def _fault(rng, job, attempt, resume):
    """A fault the attempt reaches: its epoch at or after the attempt's
    first (`resume`); a restore only where there is one (a later attempt;
    the fit job restores only a backup that exists)."""
    moments = [m for m in MOMENTS_OF[job]
               if not (m == "restore" and (attempt == 0 or (job == "fit" and resume == 0)))
               and not (m == "save" and resume >= EPOCHS - 1)]
    moment = rng.choice(moments)
    epoch = fault_points.ANY_EPOCH
    if moment in ("batch", "collective"):
        epoch = rng.randrange(resume, EPOCHS)
    elif moment == "save":
        epoch = rng.randrange(resume, EPOCHS - 1)  # the last epoch's backup is the final one
    victims = rng.choice(ALONE if moment == "collective" else VICTIMS)
    return Fault(attempt, victims, moment, epoch, rng.choice(fault_points.WAYS))
