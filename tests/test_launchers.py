"""`tfdtape.launchers`: the one reading of the job a launcher started, from
each launcher's environment (TF_CONFIG, Slurm, Open MPI, MPICH), and the
refusals of a launch that cannot be one job. In-process tests read made-up
environments; the `cluster` tests start 2 processes with a Slurm step's
variables (no Slurm: tests/test_engines.py runs the real engines) and
compare MultiWorkerMirroredStrategy() with tfdtape against one device and
against stock TensorFlow (the control: a job of one per process)."""

import json
import os
import socket
import subprocess
import sys
import types

import pytest

import loopback
from tfdtape import launchers
from tfdtape.launchers import job as job_lib
from tfdtape.launchers import mpi_addresses
from tfdtape.launchers import mpich
from tfdtape.launchers import slurm

SWITCH = "TFDTAPE_INDEPENDENT_PROCESSES=1"
ENGINE_PROCESS = str(loopback.TESTS / "engine_process.py")


def slurm_step(rank, nodes="node[01-02]", per_node="2(x2)", size=4, **more):
    """The variables srun gives task `rank` of a block-distributed step."""
    counts = slurm.expand_counts(per_node)
    kind = more.get("SLURM_DISTRIBUTION", "block").replace(",", ":").split(":")[0]
    node, local = slurm.task_places(counts, kind)[rank]
    return {"SLURM_STEP_NUM_TASKS": str(size), "SLURM_NTASKS": str(size),
            "SLURM_PROCID": str(rank), "SLURM_STEP_NODELIST": nodes,
            "SLURM_STEP_TASKS_PER_NODE": per_node, "SLURM_NODEID": str(node),
            "SLURM_LOCALID": str(local), "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0",
            **more}


def tf_config(cluster, task_type, index):
    return {"TF_CONFIG": json.dumps({"cluster": cluster,
                                     "task": {"type": task_type, "index": index}})}


def test_alone_without_a_launcher():
    assert launchers.find_job({}) is None
    assert launchers.find_job({"OMPI_COMM_WORLD_SIZE": "1", "PMI_SIZE": "1"}) is None


def test_tf_config_chief_is_rank_0_and_workers_follow():
    cluster = {"chief": ["a:1"], "worker": ["b:2", "c:3"], "evaluator": ["d:4"]}
    chief = launchers.find_job(tf_config(cluster, "chief", 0))
    second = launchers.find_job(tf_config(cluster, "worker", 1))
    assert (chief.rank, chief.size, chief.task_type) == (0, 3, "chief")
    assert (second.rank, second.size, second.task_type, second.task_index) == (
        2, 3, "worker", 1)
    assert second.addresses == ("a:1", "b:2", "c:3")
    assert second.cluster() == {"chief": ["a:1"], "worker": ["b:2", "c:3"]}
    assert (second.local_rank, second.local_size) == (0, 1)
    assert second.launcher == "TF_CONFIG"


def test_tf_config_evaluator_does_not_train():
    cluster = {"chief": ["a:1"], "worker": ["b:2"], "evaluator": ["d:4"]}
    for tasks in (cluster, {"evaluator": ["d:4"]}):
        found = launchers.find_job(tf_config(tasks, "evaluator", 0))
        assert (found.task_type, found.size, found.addresses) == ("evaluator", 1, ())


def test_tf_config_of_tfdtape_launch_keeps_the_launchers_local_ranks():
    cluster = {"worker": ["h:1", "h:2"]}
    found = launchers.find_job({**tf_config(cluster, "worker", 1), "TFDTAPE_RANK": "1",
                                "TFDTAPE_LOCAL_RANK": "1", "TFDTAPE_LOCAL_SIZE": "2"})
    assert (found.launcher, found.rank, found.local_rank, found.local_size) == (
        "tfdtape launch", 1, 1, 2)


def test_tf_config_of_one_process_or_with_parameter_servers_is_no_job():
    assert launchers.find_job(tf_config({"worker": ["a:1"]}, "worker", 0)) is None
    assert launchers.find_job(tf_config({"worker": ["a:1", "b:2"], "ps": ["c:3"]},
                                        "worker", 0)) is None


def test_tf_config_wins_over_slurm_and_is_alone_when_it_says_so():
    environ = {**slurm_step(1), **tf_config({"worker": ["a:1"]}, "worker", 0)}
    assert launchers.find_job(environ) is None


def test_unreadable_tf_config_is_refused():
    with pytest.raises(ValueError, match=r"^tfdtape: the job's processes cannot be read "
                       r"from TF_CONFIG \(TF_CONFIG\): expected a JSON object"):
        launchers.find_job({"TF_CONFIG": "{not json"})
    with pytest.raises(ValueError, match="task worker:2 is not in its cluster"):
        launchers.find_job(tf_config({"worker": ["a:1", "b:2"]}, "worker", 2))


def test_slurm_block_step_on_two_nodes():
    found = [launchers.find_job(slurm_step(rank)) for rank in range(4)]
    assert [(job.rank, job.local_rank, job.local_size) for job in found] == [
        (0, 0, 2), (1, 1, 2), (2, 0, 2), (3, 1, 2)]
    addresses = found[0].addresses
    assert all(job.addresses == addresses for job in found)
    hosts = [address.split(":")[0] for address in addresses]
    ports = [int(address.split(":")[1]) for address in addresses]
    assert hosts == ["node01", "node01", "node02", "node02"]
    assert ports[1] == ports[0] + 1 and ports[2:] == ports[:2]
    assert job_lib.PORT_RANGE[0] <= ports[0] < job_lib.PORT_RANGE[1]
    assert found[0].launcher == "Slurm (srun)" and found[0].gpus is None


def test_slurm_steps_of_one_job_get_other_ports():
    first = launchers.find_job(slurm_step(0))
    second = launchers.find_job(slurm_step(0, SLURM_STEP_ID="1"))
    other_job = launchers.find_job(slurm_step(0, SLURM_JOB_ID="78"))
    assert len({first.addresses[0], second.addresses[0], other_job.addresses[0]}) == 3


def test_slurm_cyclic_step_deals_tasks_to_nodes_in_turn():
    found = launchers.find_job(slurm_step(1, per_node="2,1", size=3,
                                          SLURM_DISTRIBUTION="cyclic"))
    assert slurm.task_places([2, 1], "cyclic") == [(0, 0), (1, 0), (0, 1)]
    assert [address.split(":")[0] for address in found.addresses] == [
        "node01", "node02", "node01"]
    assert (found.local_rank, found.local_size) == (0, 1)


def test_slurm_hostlists_and_counts():
    assert slurm.expand_hostlist("rack[1-2]-n[08-10,5],login") == [
        "rack1-n08", "rack1-n09", "rack1-n10", "rack1-n5", "rack2-n08", "rack2-n09",
        "rack2-n10", "rack2-n5", "login"]
    assert slurm.expand_counts("2(x3),1") == [2, 2, 2, 1]


def test_a_batch_script_is_one_process():
    environ = slurm_step(0)
    del environ["SLURM_STEP_NUM_TASKS"]  # sbatch's script: no step of its own
    assert launchers.find_job(environ) is None


def test_slurm_layout_that_cannot_be_read_is_refused_naming_the_switch():
    with pytest.raises(job_lib.JobFormationError) as caught:
        launchers.find_job(slurm_step(0, SLURM_DISTRIBUTION="plane=2"))
    assert str(caught.value).startswith(
        "tfdtape: Slurm (srun) started several processes and they cannot be made "
        "one job (tfdtape.launchers.find_job): expected tasks distributed block or cyclic over the "
        "nodes, found SLURM_DISTRIBUTION=plane=2 in TensorFlow ")
    assert str(caught.value).endswith(
        "Start the job with srun --distribution=block (the default); if each process "
        f"is meant to be a job of its own (a sweep), set {SWITCH}.")
    with pytest.raises(job_lib.JobFormationError, match="SLURM_NODEID=0, SLURM_LOCALID=0"):
        launchers.find_job({**slurm_step(1), "SLURM_LOCALID": "0"})
    with pytest.raises(job_lib.JobFormationError, match="nodes .'node01', 'node02'. "
                       "with tasks .3."):
        launchers.find_job(slurm_step(0, per_node="3"))


def test_slurm_distribution_options_and_ranks_out_of_range():
    packed = launchers.find_job(slurm_step(1, SLURM_DISTRIBUTION="block,pack"))
    assert (packed.rank, packed.local_rank) == (1, 1)
    cyclic = launchers.find_job(slurm_step(1, per_node="2,1", size=3,
                                           SLURM_DISTRIBUTION="cyclic:block,nopack"))
    assert cyclic.addresses[1].startswith("node02:")
    for rank in ("4", "-1"):
        with pytest.raises(job_lib.JobFormationError, match=(
                f"expected SLURM_PROCID between 0 and 3 .SLURM_STEP_NUM_TASKS=4., found "
                f"SLURM_PROCID={rank} ")):
            launchers.find_job({**slurm_step(1), "SLURM_PROCID": rank})
    with pytest.raises(job_lib.JobFormationError, match=(
            "expected SLURM_PROCID an integer, found SLURM_PROCID='one' in TensorFlow .*"
            "Leave SLURM_PROCID as Slurm .srun. sets it")):
        launchers.find_job({**slurm_step(1), "SLURM_PROCID": "one"})
    with pytest.raises(job_lib.JobFormationError, match="expected TFDTAPE_LOCAL_RANK an "
                       "integer, found TFDTAPE_LOCAL_RANK='x'"):
        launchers.find_job({**tf_config({"worker": ["h:1", "h:2"]}, "worker", 1),
                            "TFDTAPE_LOCAL_RANK": "x"})


def test_slurm_gpus_one_per_task():
    four = {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert launchers.find_job(slurm_step(3, **four)).gpus == ("1",)
    assert launchers.find_job(slurm_step(2, SLURM_STEP_GPUS="4,5")).gpus == ("4",)
    assert launchers.find_job(slurm_step(1, CUDA_VISIBLE_DEVICES="6")).gpus == ("6",)
    with pytest.raises(job_lib.JobFormationError, match=r"expected a GPU for each of "
                       r"the node's 2 tasks, found SLURM_STEP_GPUS=0"):
        slurm.task_gpus({"SLURM_STEP_GPUS": "0,"}, 1, 2)
    for hidden in ("", "-1"):  # the task's own choice: no GPU
        assert slurm.task_gpus({"SLURM_STEP_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": hidden},
                               1, 2) is None
    with pytest.raises(job_lib.JobFormationError, match="srun --gpus-per-task=1"):
        slurm.task_gpus({"SLURM_STEP_GPUS": "0,1"}, 2, 3)


def open_mpi(rank, size=2, local_size=2, **more):
    return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(size),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(rank % local_size),
            "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
            "PMIX_NAMESPACE": "prterun-vm-3271@1", **more}


def test_open_mpi_on_one_host():
    found = [launchers.find_job(open_mpi(rank)) for rank in range(2)]
    assert found[0].addresses == found[1].addresses
    base = job_lib.derived_base_port("open-mpi-prterun-vm-3271@1", 2)
    assert found[1].addresses == (f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}")
    assert (found[1].launcher, found[1].rank, found[1].size) == ("Open MPI (mpirun)", 1, 2)
    other = launchers.find_job(open_mpi(0, PMIX_NAMESPACE="prterun-vm-4000@1"))
    assert other.addresses != found[0].addresses


def test_mpi_on_several_hosts_without_mpi4py_is_refused(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # as if not installed
    mpi_addresses._exchanged.clear()
    with pytest.raises(job_lib.JobFormationError) as caught:
        launchers.find_job(open_mpi(1, size=4, local_size=2))
    assert str(caught.value).startswith(
        "tfdtape: Open MPI (mpirun) started several processes and they cannot be made "
        "one job (tfdtape.launchers.find_job): expected mpi4py, to exchange the processes' "
        "addresses (they run on several hosts and the launcher names none), found no "
        "module mpi4py in TensorFlow ")
    assert 'Install MPI\'s Python binding: pip install "tfdtape[mpi]"; if each' in str(
        caught.value)


class _World:
    """A stand-in for mpi4py's COMM_WORLD of process 1 of 2."""

    def __init__(self):
        self.gathers = 0

    def Get_rank(self):
        return 1

    def Get_size(self):
        return 2

    def allgather(self, value):
        self.gathers += 1
        return ["hostA:1111", value]


def test_mpi_addresses_are_exchanged_once_over_mpi(monkeypatch):
    world = _World()
    module = types.ModuleType("mpi4py")
    module.MPI = types.SimpleNamespace(COMM_WORLD=world)
    monkeypatch.setitem(sys.modules, "mpi4py", module)
    mpi_addresses._exchanged.clear()
    environ = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0",
               "MPI_LOCALNRANKS": "1"}
    found = launchers.find_job(environ)
    again = launchers.find_job(environ)
    assert found.addresses[0] == "hostA:1111" and again.addresses == found.addresses
    assert (found.launcher, found.rank, found.size, world.gathers) == (
        mpich.LAUNCHER, 1, 2, 1)
    mpi_addresses._exchanged.clear()


def test_srun_starting_mpi_is_slurms_step_and_mpirun_inside_an_allocation_is_mpis():
    agreeing = {**slurm_step(1, nodes="n1", per_node="2", size=2), "PMI_RANK": "1",
                "PMI_SIZE": "2"}
    assert launchers.find_job(agreeing).launcher == "Slurm (srun)"
    inside = {**slurm_step(0, nodes="n1", per_node="2", size=2), **open_mpi(1)}
    assert launchers.find_job(inside).launcher == "Open MPI (mpirun)"


def test_the_switch_makes_each_process_its_own_job():
    assert launchers.find_job({**slurm_step(1), "TFDTAPE_INDEPENDENT_PROCESSES": "1"}) is None
    assert launchers.find_job({**open_mpi(1), "TFDTAPE_INDEPENDENT_PROCESSES": "yes"}) is None
    with pytest.raises(job_lib.JobFormationError, match="separate jobs asked for where "
                       "TF_CONFIG names one job"):
        launchers.find_job({**tf_config({"worker": ["a:1", "b:2"]}, "worker", 0),
                            "TFDTAPE_INDEPENDENT_PROCESSES": "1"})
    with pytest.raises(ValueError, match="TFDTAPE_INDEPENDENT_PROCESSES='maybe' is not "
                       "understood"):
        launchers.find_job({"TFDTAPE_INDEPENDENT_PROCESSES": "maybe"})


def test_hydra_proxy_is_none_outside_hydra():
    assert mpich.hydra_proxy() is None


def _fake_slurm_processes(mode, install):
    ports = loopback.free_ports(1)  # a job id no other test uses
    envs = [{**slurm_step(rank, nodes="localhost", per_node="2", size=2,
                          SLURM_JOB_ID=str(ports[0])),
             "TFDTAPE_AUTOINSTALL": "1" if install else "0"} for rank in range(2)]
    return loopback.run_processes([None, None], [ENGINE_PROCESS, mode], 240, envs=envs)


@pytest.mark.cluster
@pytest.mark.per_release
def test_strategy_without_a_resolver_spans_a_slurm_step():
    reference = loopback.run_processes([None], [ENGINE_PROCESS, "reference"], 120)[0]
    found = _fake_slurm_processes("strategy", install=True)
    assert [result["task"] for result in found] == [["worker", 0], ["worker", 1]]
    assert [result["replicas"] for result in found] == [2, 2]
    for result in found:
        assert result["weights"] == pytest.approx(reference["weights"], rel=1e-6, abs=1e-7)
    control = _fake_slurm_processes("strategy", install=False)
    assert [result["replicas"] for result in control] == [1, 1]  # two jobs of one
    assert [result["task"] for result in control] == [[None, None], [None, None]]


def test_horovod_init_in_an_evaluator_is_refused(monkeypatch):
    import tfdtape.horovod as hvd
    from tfdtape.horovod import basics
    hvd.shutdown()
    monkeypatch.setattr(basics, "_joined", None)  # the job an earlier test joined
    cluster = {"chief": ["a:1"], "worker": ["b:2"], "evaluator": ["d:4"]}
    monkeypatch.setenv("TF_CONFIG", tf_config(cluster, "evaluator", 0)["TF_CONFIG"])
    with pytest.raises(RuntimeError, match=r"^tfdtape: init\(\) in TF_CONFIG's evaluator "
                       r"\(tfdtape.horovod.init\): expected a training process"):
        hvd.init()
    assert not hvd.is_initialized()


def test_info_names_the_job_it_found():
    environ = dict(slurm_step(1, nodes="vm", per_node="2", size=2), TF_CPP_MIN_LOG_LEVEL="3")
    completed = subprocess.run([sys.executable, "-m", "tfdtape", "info"], capture_output=True,
                               text=True, timeout=120,
                               env={**{key: value for key, value in os.environ.items()
                                       if key != "TF_CONFIG"}, **environ})
    jobs = [line for line in completed.stdout.splitlines() if line.startswith("job: ")]
    assert len(jobs) == 1
    assert jobs[0].startswith("job: Slurm (srun): process 1 of 2 (local 1 of 2), workers vm:")
    assert jobs[0].endswith(" (job 77 step 0)")


def test_slurm_requeue_is_armed_only_for_a_slurm_job_with_python_s_default(monkeypatch):
    import signal

    from tfdtape.launchers import slurm_requeue
    monkeypatch.setattr(signal, "signal", lambda number, handler: armed.append(number))
    armed = []
    step = slurm_step(0)
    job = launchers.find_job(step)
    assert slurm_requeue.arm(job, step) is True and armed == [signal.SIGUSR1]
    assert slurm_requeue.arm(job, {**step, "TFDTAPE_SLURM_REQUEUE": "0"}) is False
    assert slurm_requeue.arm(launchers.find_job(open_mpi(0)), open_mpi(0)) is False
    without_job_id = {key: value for key, value in step.items() if key != "SLURM_JOB_ID"}
    assert slurm_requeue.arm(job, without_job_id) is False
    monkeypatch.setattr(signal, "getsignal", lambda number: print)  # the program's own
    assert slurm_requeue.arm(job, step) is False
    assert armed == [signal.SIGUSR1]


def test_slurm_requeue_handler_requeues_from_task_0_only(monkeypatch, capsys):
    from tfdtape.launchers import slurm_requeue
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda command, **_: calls.append(command) or
                        types.SimpleNamespace(returncode=1, stderr="Requested operation is "
                                              "presently disabled"))
    slurm_requeue._requeue_handler(1, "77")(10, None)
    assert calls == []
    slurm_requeue._requeue_handler(0, "77")(10, None)
    assert calls == [["scontrol", "requeue", "77"]]
    assert capsys.readouterr().err == (
        "tfdtape: Slurm signalled the job's time limit (SIGUSR1); task 0 could not "
        "requeue it: Requested operation is presently disabled (submit with sbatch "
        "--requeue)\n")


def _one_task_of_a_step(code, environ):
    """Runs `code` as the task `environ` (a Slurm step's variables) names
    (the step's other task is never started: the refusals come before any
    waiting)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**{key: value for key, value in os.environ.items()
                                               if key != "TF_CONFIG"}, **environ,
                                            "TF_CPP_MIN_LOG_LEVEL": "3"})


def test_a_derived_port_another_program_holds_is_named():
    environ = slurm_step(1, nodes="localhost", per_node="2", size=2, SLURM_JOB_ID="4242")
    port = int(launchers.find_job(environ).addresses[1].rsplit(":", 1)[1])
    with socket.socket() as holder:
        holder.bind(("", port))
        holder.listen()
        completed = _one_task_of_a_step(
            "import tensorflow as tf, tfdtape\ntf.distribute.MultiWorkerMirroredStrategy()",
            environ)
    last = completed.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "tfdtape.launchers.job.JobFormationError: tfdtape: Slurm (srun) started several "
        "processes and they cannot be made one job (tfdtape.launchers.find_job): expected "
        f"port {port} free on this host for process 1 (job 4242 step 0), found it taken "
        "(Address already in use) in TensorFlow "), last
    assert "srun --kill-on-bad-exit=1 ends them at once" in last


def test_the_strategy_after_tensorflows_runtime_started_says_why():
    completed = _one_task_of_a_step(
        "import tensorflow as tf, tfdtape\ntf.constant(1.0) + 1\n"
        "tf.distribute.MultiWorkerMirroredStrategy()",
        slurm_step(0, nodes="localhost", per_node="2", size=2, SLURM_JOB_ID="4243"))
    last = completed.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "RuntimeError: tfdtape: MultiWorkerMirroredStrategy() in a job of 2 processes "
        "Slurm (srun) started, after TensorFlow's runtime started "
        "(tf.distribute.MultiWorkerMirroredStrategy): expected the strategy created "
        "before any TensorFlow operation"), last
    assert last.endswith("set TFDTAPE_INDEPENDENT_PROCESSES=1."), last


def test_the_port_check_lets_an_earlier_attempts_closed_connections_be():
    """A requeued job's ports are its first attempt's; connections of that
    attempt's server may linger in TIME_WAIT on them, which TensorFlow's
    server (SO_REUSEADDR) binds over: so does the check."""
    from tfdtape.launchers import tensorflow_job
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC's
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = listener.accept()
    accepted.close()  # the server's side closes first: its end waits (TIME_WAIT)
    client.close()
    listener.close()
    with socket.socket() as plain:
        with pytest.raises(OSError):
            plain.bind(("", port))  # the wait holds the port for a plain bind
    job = launchers.LauncherJob("Slurm (srun)", 0, 2, 0, 2,
                                (f"localhost:{port}", "localhost:1"))
    tensorflow_job._check_port_free(job)  # no refusal
