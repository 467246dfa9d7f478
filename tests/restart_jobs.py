"""The jobs that survive a restart, launched with `python -m tfdtape launch`
on loopback, and each one run whole once a test session (the oracle of
tests/test_keras_saving.py, test_checkpoint_loop.py, test_horovod.py and
test_generated_faults.py):

    fit      tests/keras_saving_process.py: Keras 3 `fit` with the
             tutorial's callbacks and the final saves on one directory
    loop     tests/checkpoint_loop_process.py: a custom loop with
             `tf.train.CheckpointManager`
    horovod  tests/horovod_scripts/checkpoint_resume.py: Horovod's Keras
             checkpoint pattern on rank 0
    elastic  tests/horovod_scripts/elastic_training.py: Horovod's elastic
             API, its commits in the job's directory (TFDTAPE_LAUNCH_DIR)

A job's arguments follow the directory on its script's command line (the
elastic script takes its arguments alone: the directory is its
TFDTAPE_LAUNCH_DIR).
"""

import os
import pathlib
import subprocess
import sys
import types

import exercise_recorder
import loopback

HERE = pathlib.Path(__file__).resolve().parent
SCRIPTS = {"fit": HERE / "keras_saving_process.py",
           "loop": HERE / "checkpoint_loop_process.py",
           "horovod": HERE / "horovod_scripts" / "checkpoint_resume.py",
           "elastic": HERE / "horovod_scripts" / "elastic_training.py"}
TIME_LIMIT_SECONDS = 300
_whole = {}


class Job(types.SimpleNamespace):
    """A finished launch: its exit status, stderr, and each rank's JSON."""


def temporary_of(directory):
    """The TMPDIR of the launch writing in `directory`: beside it."""
    return pathlib.Path(directory).parent / "tmp"


def launch(job, directory, *arguments, processes=2, restarts=0, env=None):
    """`job`'s script under `tfdtape launch -np PROCESSES --max-restarts
    RESTARTS`, writing in `directory`; returns a Job."""
    temporary = temporary_of(directory)
    temporary.mkdir(exist_ok=True)
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TMPDIR=str(temporary),
                       PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
                       **(env or {}))
    environment.pop("TF_CONFIG", None)
    recorder = ([str(HERE / "recorded_process.py")]
                if exercise_recorder.ENVIRONMENT in environment else [])
    if job == "elastic":
        environment["TFDTAPE_LAUNCH_DIR"] = str(directory)
    else:
        arguments = (str(directory), *arguments)
    completed = subprocess.run(
        [sys.executable, "-m", "tfdtape", "launch", "-np", str(processes), "--grace", "3",
         "--max-restarts", str(restarts), sys.executable, *recorder, str(SCRIPTS[job]),
         *arguments],
        env=environment, capture_output=True, text=True, timeout=TIME_LIMIT_SECONDS)
    return Job(status=completed.returncode, stderr=completed.stderr,
               ranks=loopback.launched_outputs(completed.stdout))


def uninterrupted(job, tmp_path_factory, *arguments, processes=2):
    """(directory, Job) of `job` with `arguments` on `processes`, never
    interrupted; run once a session."""
    key = (job, arguments, processes)
    if key not in _whole:
        directory = tmp_path_factory.mktemp(f"uninterrupted-{job}") / "job"
        directory.mkdir()
        launched = launch(job, directory, *arguments, processes=processes)
        assert launched.status == 0, launched.stderr[-3000:]
        _whole[key] = (directory, launched)
    return _whole[key]
