"""`python -m tfdtape launch`: the processes of a job, their places in it,
their output prefixed with their rank, and a failure that ends them all.

The launched commands here are small Python programs that do not import
TensorFlow; the cluster test starts a real MultiWorkerMirroredStrategy from
the environment the launcher gives.
"""

import ast
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from tfdtape.cli import command_line
from tfdtape.cli import launch_command


def launch(*arguments, env=None, timeout=120):
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **(env or {}))
    environment.pop("TF_CONFIG", None)
    environment.pop("CUDA_VISIBLE_DEVICES", None)
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", "tfdtape", "launch", *arguments],
                          capture_output=True, text=True, env=environment,
                          timeout=timeout)


def python(code):
    return [sys.executable, "-c", textwrap.dedent(code)]


PRINT_PLACE = """
    import json, os
    names = ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE")
    print(json.dumps({"tfdtape": [int(os.environ["TFDTAPE_" + n]) for n in names],
                      "horovod": [int(os.environ["HOROVOD_" + n]) for n in names],
                      "tf_config": json.loads(os.environ["TF_CONFIG"]),
                      "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}))
"""


def places(stdout):
    """rank -> the JSON its process printed, from the prefixed lines."""
    found = {}
    for line in stdout.splitlines():
        prefix, _, text = line.partition(">:")
        assert prefix.endswith("<stdout"), line
        found[int(prefix[1:prefix.index("]")])] = json.loads(text)
    return found


def test_each_process_gets_its_rank_and_the_cluster_through_its_environment():
    completed = launch("-np", "3", *python(PRINT_PLACE))
    assert completed.returncode == 0, completed.stderr
    found = places(completed.stdout)
    assert sorted(found) == [0, 1, 2]
    workers = found[0]["tf_config"]["cluster"]["worker"]
    assert len(set(workers)) == 3 and all(w.startswith("localhost:") for w in workers)
    for rank, place in found.items():
        assert place["tfdtape"] == place["horovod"] == [rank, 3, rank, 3, 0, 1]
        assert place["tf_config"] == {"cluster": {"worker": workers},
                                      "task": {"type": "worker", "index": rank}}
        assert place["gpus"] is None


def test_ranks_go_host_by_host_and_this_host_starts_its_own():
    completed = launch("-np", "3", "-H", "alpha:2,beta:2", "--host-index", "1",
                       "--port", "4100", *python(PRINT_PLACE))
    assert completed.returncode == 0, completed.stderr
    found = places(completed.stdout)
    assert list(found) == [2]
    assert found[2]["tfdtape"] == [2, 3, 0, 1, 1, 2]
    assert found[2]["tf_config"]["cluster"]["worker"] == [
        "alpha:4100", "alpha:4101", "beta:4100"]


def test_each_local_process_sees_only_its_own_gpu():
    completed = launch("-np", "2", *python(PRINT_PLACE),
                       env={"CUDA_VISIBLE_DEVICES": "3,5"})
    assert completed.returncode == 0, completed.stderr
    assert {rank: place["gpus"] for rank, place in places(completed.stdout).items()} == {
        0: "3", 1: "5"}
    too_many = launch("-np", "3", *python(PRINT_PLACE), env={"CUDA_VISIBLE_DEVICES": "0"})
    assert too_many.returncode == command_line.EXIT_UNUSABLE
    assert too_many.stdout == ""
    assert "launch: 3 processes on this host but 1 GPU(s)" in too_many.stderr


def test_output_lines_carry_their_rank_and_stream():
    completed = launch("-np", "2", *python("""
        import os, sys
        rank = os.environ["TFDTAPE_RANK"]
        print("out", rank, flush=True)
        print("err", rank, file=sys.stderr, flush=True)
        sys.stdout.write("no newline " + rank)
    """))
    assert completed.returncode == 0, completed.stderr
    assert sorted(completed.stdout.splitlines()) == [
        "[0]<stdout>:no newline 0", "[0]<stdout>:out 0",
        "[1]<stdout>:no newline 1", "[1]<stdout>:out 1"]
    assert sorted(line for line in completed.stderr.splitlines()
                  if not line.startswith("tfdtape launch:")) == [
        "[0]<stderr>:err 0", "[1]<stderr>:err 1"]


def launcher_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("tfdtape launch:")]


RESTARTED = """
    import json, os, sys, time
    rank, attempt = int(os.environ["TFDTAPE_RANK"]), int(os.environ["TFDTAPE_RESTART_COUNT"])
    with open(os.environ["SEEN"], "a") as seen:
        seen.write(json.dumps([rank, attempt, int(os.environ["TORCHELASTIC_RESTART_COUNT"]),
                               os.environ["TFDTAPE_LAUNCH_DIR"],
                               json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"]])
                   + "\\n")
    marker = os.path.join(os.environ["TFDTAPE_LAUNCH_DIR"], f"attempt-{attempt}-rank-{rank}")
    open(marker, "w").close()  # the directory outlives the attempt
    if rank == 1 and attempt < int(os.environ["FAIL_UNTIL"]):
        while not os.path.exists(marker.replace("rank-1", "rank-0")):
            time.sleep(0.01)  # rank 0 has recorded this attempt before rank 1 fails it
        sys.exit(5)
    print(sorted(os.listdir(os.environ["TFDTAPE_LAUNCH_DIR"])) if rank == 0 else "", flush=True)
"""


def test_a_failed_job_starts_again_up_to_max_restarts_on_fresh_ports(tmp_path):
    seen = tmp_path / "seen"
    completed = launch("--grace", "1", "--max-restarts", "2", "-np", "2", *python(RESTARTED),
                       env={"SEEN": str(seen), "FAIL_UNTIL": "2"})
    assert completed.returncode == 0, completed.stderr
    records = [json.loads(line) for line in seen.read_text().splitlines()]
    assert sorted((rank, attempt) for rank, attempt, *_ in records) == [
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert all(torch == attempt for _, attempt, torch, _, _ in records)
    directories = {directory for *_, directory, _ in records}
    assert len(directories) == 1 and not os.path.exists(directories.pop())  # shared, removed
    workers = {attempt: tuple(cluster) for _, attempt, _, _, cluster in records}
    assert len(set(workers.values())) == 3  # fresh ports each attempt
    lines = launcher_lines(completed.stderr)
    assert lines[0].startswith("tfdtape launch: the job's processes on this host listen on "
                               f"port(s) {', '.join(p.rsplit(':')[1] for p in workers[0])} ")
    assert lines[1:] == [
        "tfdtape launch: rank 1 exited with status 5; the other processes were stopped",
        "tfdtape launch: restarting every process (attempt 1 of 2)",
        "tfdtape launch: attempt 1 listens on port(s) "
        + ", ".join(p.rsplit(":")[1] for p in workers[1]),
        "tfdtape launch: rank 1 exited with status 5; the other processes were stopped",
        "tfdtape launch: restarting every process (attempt 2 of 2)",
        "tfdtape launch: attempt 2 listens on port(s) "
        + ", ".join(p.rsplit(":")[1] for p in workers[2])]
    # rank 0 of the last attempt finds what the earlier attempts left there
    final = [line for line in completed.stdout.splitlines() if line.startswith("[0]")][-1]
    left = set(ast.literal_eval(final.removeprefix("[0]<stdout>:")))
    assert left >= {f"attempt-{attempt}-rank-{rank}" for attempt in (0, 1) for rank in (0, 1)}
    assert "attempt-2-rank-0" in left


def test_max_restarts_gives_up_with_the_failed_status(tmp_path):
    seen = tmp_path / "seen"
    completed = launch("--grace", "1", "--max-restarts", "1", "-np", "2", *python(RESTARTED),
                       env={"SEEN": str(seen), "FAIL_UNTIL": "9"})
    assert completed.returncode == 5
    assert len(seen.read_text().splitlines()) == 4  # two attempts of two processes
    assert launcher_lines(completed.stderr)[-1] == (
        "tfdtape launch: rank 1 exited with status 5; the other processes were stopped")
    assert "restarting every process (attempt 1 of 1)" in completed.stderr
    assert "attempt 2" not in completed.stderr


def test_a_failed_process_ends_the_others_and_sets_the_status():
    began = time.monotonic()
    completed = launch("--grace", "2", "-np", "3", *python("""
        import os, sys, time
        if os.environ["TFDTAPE_RANK"] == "1":
            time.sleep(0.5)
            sys.exit(7)
        print("waiting", flush=True)
        time.sleep(120)
    """))
    assert completed.returncode == 7
    assert time.monotonic() - began < 60
    assert completed.stderr.splitlines()[-1] == (
        "tfdtape launch: rank 1 exited with status 7; the other processes were stopped")


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace():
    completed = launch("--grace", "1", "-np", "2", *python("""
        import os, signal, sys, time
        if os.environ["TFDTAPE_RANK"] == "0":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            print("ignoring", flush=True)
            time.sleep(120)
        time.sleep(1)
        os.kill(os.getpid(), signal.SIGKILL)
    """))
    assert completed.returncode == 128 + 9
    assert "rank 1 exited with status 137" in completed.stderr


@pytest.mark.parametrize("arguments, message", [
    ((), "launch: no command to run"),
    (("python",), "launch: -np N is required"),
    (("-np", "0", "python"), "launch: -np needs a whole number of at least 1, found '0'"),
    (("-np", "2", "-H", "a:1", "python"), "launch: -np 2 but the hosts have 1 slots"),
    (("-np", "2", "-H", "a:1,a:1", "python"), "launch: -H 'a:1,a:1' names a host twice"),
    (("-np", "2", "-H", "a:x", "python"),
     "launch: -H a: slots needs a whole number of at least 1, found 'x'"),
    (("-np", "2", "-H", "a:1,b:1", "--host-index", "2", "python"),
     "launch: --host-index 2, but -H names 2 host(s)"),
    (("-np", "2", "--grace", "-1", "python"),
     "launch: --grace needs seconds (0 or more), found '-1'"),
    (("-np", "2", "--bogus", "python"), "launch: unknown option --bogus"),
    (("-np", "2", "--min-np", "1", "python"),
     "launch: --min-np (a job whose number of processes changes) is not supported: "
     "TensorFlow's collectives fix a job's processes when they start. Use -np N with "
     "--max-restarts K"),
    (("--host-discovery-script=./hosts.sh", "-np", "2", "python"),
     "launch: --host-discovery-script (a job whose number of processes changes)"),
    (("-np", "2", "--max-restarts", "-1", "python"),
     "launch: --max-restarts needs a whole number of at least 0, found '-1'"),
    (("-np", "2", "-H", "a:1,b:1", "--host-index", "0", "--max-restarts", "1", "python"),
     "launch: --max-restarts restarts the processes of one host; with 2 hosts"),
    (("-np", "2", "-H", "nothere-a:1,nothere-b:1", "python"),
     "launch: -H names 2 hosts and none of them is this machine"),
    (("-np", "1", "-H", "a:1,b:1", "--host-index", "1", "python"),
     "launch: -np 1 places no process on host b"),
    (("-np", "1", "no-such-command-anywhere"),
     "launch: cannot start 'no-such-command-anywhere'"),
])
def test_bad_arguments_are_one_clear_line_and_status_2(arguments, message):
    completed = launch(*arguments)
    assert completed.returncode == command_line.EXIT_UNUSABLE
    assert completed.stderr.startswith(f"tfdtape: {message}"), completed.stderr
    assert completed.stdout == ""


def test_help_prints_the_usage():
    completed = launch("--help")
    assert completed.returncode == 0
    assert "-np N, --num-proc N" in completed.stdout
    assert completed.stdout.rstrip().endswith(launch_command.usage())


@pytest.mark.cluster
def test_launched_processes_form_a_multi_worker_strategy_listening_where_said():
    """Two processes MultiWorkerMirroredStrategy joins from the launcher's
    TF_CONFIG: an all-reduce across them is the sum of their ranks + 1. Each
    process's gRPC server listens on its port of every interface (read from
    /proc/net/tcp*), which the launcher says at start."""
    completed = launch("-np", "2", *python("""
        import json, os
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
        import tensorflow as tf
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        rank = int(os.environ["TFDTAPE_RANK"])
        total = strategy.reduce("SUM", strategy.run(
            lambda: tf.constant(rank + 1.0)), axis=None)
        port = int(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"][rank]
                   .rsplit(":", 1)[1])
        listening = []
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in open(table).read().splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:  # LISTEN
                    listening.append(address)
        print(strategy.cluster_resolver.task_id, float(total), port, sorted(listening))
    """), timeout=240)
    assert completed.returncode == 0, completed.stderr[-3000:]
    lines = sorted(completed.stdout.splitlines())
    assert [line.split()[:2] for line in lines] == [["[0]<stdout>:0", "3.0"],
                                                    ["[1]<stdout>:1", "3.0"]]
    ports = [line.split()[2] for line in lines]
    for line in lines:
        addresses = ast.literal_eval(line.split(" ", 3)[3])
        # 0.0.0.0 or :: (every interface), not loopback only
        assert addresses and set(addresses) <= {"00000000", "0" * 32}, line
    assert launcher_lines(completed.stderr)[0].startswith(
        f"tfdtape launch: the job's processes on this host listen on port(s) "
        f"{', '.join(ports)} of every network interface")
