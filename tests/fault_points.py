"""Where a planned fault ends a process of a job under `tfdtape launch`
(the job scripts of tests/generated_faults.py call `reach` at each point,
`at_batch` as batch 1 of an epoch begins).

FAULTS in the environment lists the faults, comma-separated, each
ATTEMPT:RANK:MOMENT:EPOCH:WAY: on launch attempt ATTEMPT
(TFDTAPE_RESTART_COUNT), process RANK ends at MOMENT of epoch EPOCH, by
WAY. The moments a script offers:

    batch    as batch 1 of the epoch begins (the others wait in its
             all-reduce)
    collective
             inside batch 1's first collective: the victim enters the
             step and is ended ARM_SECONDS later by a thread of its own,
             while every process that is no victim holds back
             HOLD_SECONDS before the batch, so the victim waits in the
             collective for it (one victim: a collective in which every
             process waits has no one late to wait for); the victim first
             writes to stderr where its main thread is (INSIDE_WORDS,
             the innermost Python frame's file and function: TensorFlow's
             code running the step, not the script's)
    save     inside the epoch's backup, between its weights and its
             metadata (the script's own way of writing half a backup)
    restore  inside the restore at the start of the attempt (epoch: any)
    after    once training and the final saves ended (epoch: any)

The ways: exit (os._exit(3)), kill (SIGKILL), term (SIGTERM, then
SIGKILL after a grace of GRACE_SECONDS, as Kubernetes and Slurm stop a
process: in a job of several processes TensorFlow's coordination service
catches SIGTERM, its preemption notice, and the process goes on).
"""

import os
import signal
import sys
import threading
import time

ENVIRONMENT = "FAULTS"
MOMENTS = ("batch", "collective", "save", "restore", "after")
WAYS = ("exit", "kill", "term")
ANY_EPOCH = -1
GRACE_SECONDS = 3
ARM_SECONDS = 1.0
HOLD_SECONDS = 4.0
INSIDE_WORDS = "fault_points: ended inside"


def spec(attempt, rank, moment, epoch, way):
    """One fault as FAULTS writes it."""
    return f"{attempt}:{rank}:{moment}:{epoch}:{way}"


def plan(*faults):
    """Adds `faults` (as `spec` writes them) to this process's FAULTS."""
    os.environ[ENVIRONMENT] = ",".join(filter(None, [os.environ.get(ENVIRONMENT, ""),
                                                     *faults]))


def planned(rank, environ=None):
    """{(moment, epoch): way} of process `rank` on this attempt."""
    environ = os.environ if environ is None else environ
    attempt = environ.get("TFDTAPE_RESTART_COUNT", "0")
    found = {}
    for item in filter(None, environ.get(ENVIRONMENT, "").split(",")):
        on_attempt, on_rank, moment, epoch, way = item.split(":")
        if on_attempt == attempt and int(on_rank) == rank:
            found[(moment, int(epoch))] = way
    return found


def _victims_in_collective(epoch, environ=None):
    """The ranks planned to end inside a collective of `epoch` on this
    attempt (FAULTS is the same in every process of the launch)."""
    environ = os.environ if environ is None else environ
    attempt = environ.get("TFDTAPE_RESTART_COUNT", "0")
    return {int(on_rank) for on_attempt, on_rank, moment, on_epoch, _ in (
        item.split(":") for item in filter(None, environ.get(ENVIRONMENT, "").split(",")))
        if on_attempt == attempt and moment == "collective" and int(on_epoch) == epoch}


def due(rank, moment, epoch=ANY_EPOCH):
    """The way this process ends at `moment` of `epoch`, or None."""
    faults = planned(rank)
    return faults.get((moment, epoch)) or faults.get((moment, ANY_EPOCH))


def reach(rank, moment, epoch=ANY_EPOCH):
    """Ends this process if a fault is planned here."""
    way = due(rank, moment, epoch)
    if way is not None:
        end(way)


def at_batch(rank, epoch):
    """The scripts' call as batch 1 of `epoch` begins: the moments `batch`
    and `collective` (module doc)."""
    reach(rank, "batch", epoch)
    way = due(rank, "collective", epoch)
    if way is not None:
        main = threading.get_ident()
        threading.Timer(ARM_SECONDS, _end_inside, [main, way]).start()
    elif _victims_in_collective(epoch):
        time.sleep(HOLD_SECONDS)


def _end_inside(thread, way):
    frame = sys._current_frames()[thread]
    print(f"{INSIDE_WORDS} {frame.f_code.co_filename}:{frame.f_code.co_name}",
          file=sys.stderr)
    end(way)


def end(way):
    """Ends this process by `way`, what it printed flushed."""
    sys.stdout.flush()
    sys.stderr.flush()
    if way == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif way == "term":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(GRACE_SECONDS)
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(3)
