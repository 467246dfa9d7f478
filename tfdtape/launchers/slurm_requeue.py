"""Slurm's warning before a job's time limit, as Lightning's auto-requeue
takes it: with `#SBATCH --signal=USR1@90` Slurm sends SIGUSR1 to every task
90 s before the limit; in a job of several tasks that tfdtape formed, task
0 then requeues the job (`scontrol requeue`), Slurm ends every task, and
the job starts again later, resuming from its last backup (Keras's
BackupAndRestore, a CheckpointManager). Every task takes the signal, so
none dies of it before task 0 has requeued. Installed only where SIGUSR1
has Python's default handler (a program's own is kept) and
TFDTAPE_SLURM_REQUEUE is not off.
This module must not import TensorFlow."""

import os
import signal
import subprocess
import sys

from tfdtape import switches

REQUEUE = "TFDTAPE_SLURM_REQUEUE"
"""The switch: whether a job of Slurm tasks requeues itself on SIGUSR1
(default on)."""

WARNING_SIGNAL = signal.SIGUSR1


def arm(job, environ=None):
    """Installs the requeue on SIGUSR1 for `job` (a LauncherJob of Slurm's,
    in a batch job: SLURM_JOB_ID). Returns whether it did."""
    environ = os.environ if environ is None else environ
    job_id = environ.get("SLURM_JOB_ID")
    if (not job.launcher.startswith("Slurm") or not job_id
            or signal.getsignal(WARNING_SIGNAL) is not signal.SIG_DFL
            or not switches.read(REQUEUE, True, f"Set {REQUEUE}=0 to keep Slurm's "
                                 "SIGUSR1 as it is", environ)):
        return False
    signal.signal(WARNING_SIGNAL, _requeue_handler(job.rank, job_id))
    return True


def _requeue_handler(rank, job_id):
    def requeue(number, _frame):
        """Task 0 requeues the job; the others wait for Slurm to end them."""
        if rank != 0:
            return
        completed = subprocess.run(["scontrol", "requeue", job_id], capture_output=True,
                                   text=True, check=False)
        outcome = ("requeued it" if completed.returncode == 0 else
                   f"could not requeue it: {completed.stderr.strip() or completed.returncode} "
                   "(submit with sbatch --requeue)")
        print(f"tfdtape: Slurm signalled the job's time limit ({signal.Signals(number).name}); "
              f"task 0 {outcome}", file=sys.stderr, flush=True)

    return requeue
