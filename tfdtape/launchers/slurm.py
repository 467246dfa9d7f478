"""The job of a Slurm step (`srun`): its tasks are the processes, ranked by
SLURM_PROCID, on the step's nodes. Every address comes from Slurm (the node
list, the tasks per node and their distribution); each task's port is
derived from the job and step ids, so two jobs on a node do not collide.
GPUs come from Slurm's variables, never from `nvidia-smi`.
This module must not import TensorFlow."""

import itertools
import re

from tfdtape.launchers import job as job_lib

LAUNCHER = "Slurm (srun)"


def read(environ):
    """The LauncherJob of this Slurm step's task; None outside a step of
    several tasks (a batch script itself is one process).

    Raises:
        JobFormationError: the step's layout cannot be read (a task
            distribution other than block or cyclic, variables that do not
            agree), or its GPUs cannot go one to a task.
    """
    if "SLURM_STEP_NUM_TASKS" not in environ or "SLURM_PROCID" not in environ:
        return None
    size = job_lib.integer(environ, "SLURM_STEP_NUM_TASKS", LAUNCHER)
    if size < 2:
        return None
    rank = job_lib.integer(environ, "SLURM_PROCID", LAUNCHER)
    nodes = expand_hostlist(environ.get("SLURM_STEP_NODELIST", ""))
    counts = expand_counts(environ.get("SLURM_STEP_TASKS_PER_NODE", ""))
    distribution = re.split(r"[:,]", environ.get("SLURM_DISTRIBUTION") or "block")[0]
    if len(nodes) != len(counts) or sum(counts) != size or not nodes:
        raise job_lib.refusal(
            LAUNCHER, "SLURM_STEP_NODELIST and SLURM_STEP_TASKS_PER_NODE naming "
            f"SLURM_STEP_NUM_TASKS={size} tasks",
            f"nodes {nodes} with tasks {counts}", "Start the job with srun")
    if distribution not in ("block", "cyclic"):
        raise job_lib.refusal(
            LAUNCHER, "tasks distributed block or cyclic over the nodes",
            f"SLURM_DISTRIBUTION={environ['SLURM_DISTRIBUTION']}",
            "Start the job with srun --distribution=block (the default)")
    if not 0 <= rank < size:
        raise job_lib.refusal(
            LAUNCHER, f"SLURM_PROCID between 0 and {size - 1} (SLURM_STEP_NUM_TASKS={size})",
            f"SLURM_PROCID={rank}", "Start each task with srun, which sets SLURM_PROCID")
    places = task_places(counts, distribution)
    node, local = places[rank]
    found = (job_lib.integer(environ, "SLURM_NODEID", LAUNCHER),
             job_lib.integer(environ, "SLURM_LOCALID", LAUNCHER))
    if found != (node, local):
        raise job_lib.refusal(
            LAUNCHER, f"task {rank} as node {node}, local task {local}, by the "
            f"{distribution} distribution", f"SLURM_NODEID={found[0]}, "
            f"SLURM_LOCALID={found[1]}", "Start the job with srun --distribution=block")
    job_key = f"slurm-{environ.get('SLURM_JOB_ID', '')}-{environ.get('SLURM_STEP_ID', '')}"
    base = job_lib.derived_base_port(job_key, max(counts))
    addresses = tuple(f"{nodes[on]}:{base + index}" for on, index in places)
    return job_lib.LauncherJob(
        LAUNCHER, rank, size, local, counts[node], addresses,
        task_index=rank, gpus=task_gpus(environ, local, counts[node]),
        origin=f"job {environ.get('SLURM_JOB_ID', '?')} step "
               f"{environ.get('SLURM_STEP_ID', '?')}")


def task_places(counts, distribution):
    """(node index, local task index) of each task by rank: block fills
    each node in turn, cyclic deals one task to each node that has room."""
    if distribution == "block":
        return [(node, local) for node, count in enumerate(counts)
                for local in range(count)]
    dealt = [0] * len(counts)
    places = []
    while len(places) < sum(counts):
        for node, count in enumerate(counts):
            if dealt[node] < count:
                places.append((node, dealt[node]))
                dealt[node] += 1
    return places


def task_gpus(environ, local_rank, local_size):
    """The GPUs this task should see, CUDA_VISIBLE_DEVICES' form: the one
    Slurm bound to it, or its local rank's of the step's GPUs on the node
    (CUDA_VISIBLE_DEVICES, else SLURM_STEP_GPUS); None where Slurm names
    no GPU (a CPU node) or CUDA_VISIBLE_DEVICES hides every GPU ("" or
    "-1": the task's own choice, kept).

    Raises:
        JobFormationError: fewer GPUs on the node than tasks.
    """
    if environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1"):
        return None
    for name in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS"):
        listed = [item.strip() for item in environ.get(name, "").split(",") if item.strip()]
        if listed and listed != ["-1"]:
            break
    else:
        return None
    if name == "CUDA_VISIBLE_DEVICES" and len(listed) == 1:
        return tuple(listed)  # Slurm bound this task to its GPU
    if len(listed) < local_size:
        raise job_lib.refusal(
            LAUNCHER, f"a GPU for each of the node's {local_size} tasks",
            f"{name}={','.join(listed)}",
            "Ask Slurm for one GPU per task (srun --gpus-per-task=1)")
    return (listed[local_rank],)


def expand_hostlist(text):
    """Slurm's compressed host list (`node[01-03,07],login`) as names."""
    names = []
    for item in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", text):
        parts = re.split(r"(\[[^\]]*\])", item)
        choices = [_bracket(part) if part.startswith("[") else [part] for part in parts]
        names += ["".join(combination) for combination in itertools.product(*choices)]
    return names


def _bracket(part):
    values = []
    for piece in part[1:-1].split(","):
        low, _, high = piece.partition("-")
        if not high:
            values.append(low)
            continue
        width = len(low)
        values += [str(number).zfill(width) for number in range(int(low), int(high) + 1)]
    return values


def expand_counts(text):
    """Slurm's tasks per node (`2(x3),1`) as one count per node."""
    counts = []
    for item in filter(None, text.split(",")):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if match is None:
            return []
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts
