"""The job TF_CONFIG describes: `tfdtape launch`'s, Kubeflow's TFJob's, Ray
Train's or a program's own. Its training processes are the chief (rank 0,
where there is one) and then the workers in order; an evaluator does not
train, and a cluster with parameter servers is no job of all-reduces.
This module must not import TensorFlow."""

import json

from tfdtape import errors
from tfdtape.launchers import job as job_lib

TRAINING_TASKS = ("chief", "worker")
"""TF_CONFIG's task types that train, in rank order."""

LAUNCHERS = ("tfdtape launch", "TF_CONFIG")
"""The launchers of the jobs TF_CONFIG describes (TensorFlow reads those
itself)."""

LAUNCH_DIRECTORY = "TFDTAPE_LAUNCH_DIR"
"""`tfdtape launch`'s directory, which every attempt of a launch shares."""
RESTART_COUNT = "TFDTAPE_RESTART_COUNT"
"""`tfdtape launch`'s attempt of the job (0 first)."""


def read(environ):
    """The LauncherJob TF_CONFIG gives this process; None without TF_CONFIG,
    with a cluster of one training process, or with parameter servers
    (TensorFlow's ParameterServerStrategy reads that one itself).

    Raises:
        ValueError: TF_CONFIG is not a JSON object with a cluster, or its
            task is not in its cluster.
    """
    raw = environ.get("TF_CONFIG")
    if not raw:
        return None
    try:
        config = json.loads(raw)
        cluster = config.get("cluster") or {}
        task = config.get("task") or {}
        task_type, task_index = task.get("type"), int(task.get("index", 0))
        tasks = {name: list(cluster.get(name) or []) for name in cluster}
    except (ValueError, AttributeError, TypeError) as error:
        raise ValueError(_unreadable(raw, error)) from None
    if tasks.get("ps"):
        return None
    launcher = LAUNCHERS[0] if "TFDTAPE_RANK" in environ else LAUNCHERS[1]
    if task_type == "evaluator":
        return job_lib.LauncherJob(launcher, 0, 1, 0, 1, (), "evaluator", task_index,
                                   origin="TF_CONFIG's evaluator: not a training process")
    addresses = [address for name in TRAINING_TASKS for address in tasks.get(name, [])]
    if len(addresses) < 2:
        return None
    if task_type not in TRAINING_TASKS or not 0 <= task_index < len(tasks.get(task_type, [])):
        raise ValueError(_unreadable(raw, f"task {task_type}:{task_index} is not in "
                                          "its cluster's chief or workers"))
    rank = (len(tasks.get("chief", [])) if task_type == "worker" else 0) + task_index
    hosts = [address.rsplit(":", 1)[0] for address in addresses]
    same_host = [index for index, host in enumerate(hosts) if host == hosts[rank]]
    local_rank = launcher_int(environ, "LOCAL_RANK", same_host.index(rank))
    local_size = launcher_int(environ, "LOCAL_SIZE", len(same_host))
    return job_lib.LauncherJob(launcher, rank, len(addresses), local_rank, local_size,
                               tuple(addresses), task_type, task_index,
                               origin=f"TF_CONFIG task {task_type}:{task_index}",
                               chiefs=len(tasks.get("chief", [])))


def launcher_int(environ, name, default):
    """TFDTAPE_<name>, else HOROVOD_<name> (`tfdtape launch`, horovodrun),
    else `default`.

    Raises:
        JobFormationError: a value that is no integer.
    """
    for prefix in ("TFDTAPE_", "HOROVOD_"):
        if prefix + name in environ:
            return job_lib.integer(environ, prefix + name, "tfdtape launch")
    return default


def _unreadable(raw, error):
    return errors.message(
        "the job's processes cannot be read from TF_CONFIG", "TF_CONFIG",
        "a JSON object with a cluster and this process's task in it",
        f"{raw[:120]!r} ({error})",
        "Start the job with `tfdtape launch`, or set TF_CONFIG as "
        "MultiWorkerMirroredStrategy documents it")
