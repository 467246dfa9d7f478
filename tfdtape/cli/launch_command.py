"""`python -m tfdtape launch -np N [OPTIONS] COMMAND [ARGS...]`: starts the
processes of one multi-worker job on this host, as `horovodrun` does.

Each process gets its place in the job through its environment: `TF_CONFIG`
(the cluster of every process's host and port, and its own index: what
MultiWorkerMirroredStrategy and `tfdtape.horovod.init()` read), and its
rank, size, local rank and size, cross rank and size as `TFDTAPE_RANK`, ...
and under Horovod's names (`HOROVOD_RANK`, ...). Where this host has GPUs
(`CUDA_VISIBLE_DEVICES`, else `nvidia-smi -L`), each process sees only the
GPU of its local rank. Every line a process writes is prefixed with its rank,
`[rank]<stdout>:` or `[rank]<stderr>:`. When a process fails, the others
are stopped (SIGTERM, then SIGKILL after --grace seconds); with
--max-restarts N every process is then started again, up to N times (on
fresh ports where the launcher chose them), each seeing its attempt as
TFDTAPE_RESTART_COUNT (0 first; also TORCHELASTIC_RESTART_COUNT, torchrun's
name); after the last failed attempt the launcher exits with the failed
process's status (128 + the signal for a process a signal ended); it exits
0 when every process did. Every attempt shares one directory of the launch,
TFDTAPE_LAUNCH_DIR (where `tfdtape.horovod.elastic` keeps its commits).

TensorFlow's gRPC servers, which the processes start, listen on every
network interface of their host without authentication, and whoever reaches
them can run operations in the job: the launcher says at start which ports
the job opens. Run jobs on trusted networks only.

Options (before COMMAND):
  -np N, --num-proc N   the number of processes of the whole job
  -H HOSTS, --hosts HOSTS
                        host:slots,... (default localhost:N); ranks are given
                        host by host, in this order
  --host-index I        which host of -H this launcher starts (default: the
                        one named as this machine, or the only one)
  --port P              the first port; rank r listens on P + its local rank
                        (default: free ports on a single local host, 29500
                        with several hosts)
  --grace S             seconds between SIGTERM and SIGKILL (default 10)
  --max-restarts N      when a process fails, start every process again, up
                        to N times (default 0: the first failure ends the
                        job); one host only (several hosts: the scheduler's
                        restart policy, docs/strategies.md)

Several hosts: run the same `tfdtape launch -np N -H HOSTS --port P` on
each host, with `--host-index` where the host's name is not the one in
HOSTS (docs/horovod.md).
"""

import dataclasses
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from tfdtape.cli import command_line
from tfdtape.launchers import tf_config

DEFAULT_PORT = 29500
LOCAL_NAMES = ("localhost", "127.0.0.1")


def usage():
    return (f"usage: {command_line.program_name()} launch -np N [-H HOST:SLOTS,...] "
            "[--host-index I] [--port P] [--grace S] [--max-restarts N] "
            "COMMAND [ARGS...]")


@dataclasses.dataclass
class Options:
    """The parsed command line of `launch`."""
    processes: int = 0
    hosts: list = dataclasses.field(default_factory=list)  # [(name, slots)]
    host_index: int = None
    port: int = None
    grace: float = 10.0
    max_restarts: int = 0
    command: list = dataclasses.field(default_factory=list)


_VALUED = {"-np": "processes", "--num-proc": "processes", "-H": "hosts",
           "--hosts": "hosts", "--host-index": "host_index", "--port": "port",
           "--grace": "grace", "--max-restarts": "max_restarts"}


_ELASTIC = ("--min-np", "--min-num-proc", "--max-np", "--max-num-proc",
            "--host-discovery-script", "--slots-per-host", "--elastic-timeout",
            "--reset-limit", "--blacklist-cooldown-range")
"""horovodrun's options for a job whose number of processes changes."""


def parse(argv):
    """Options from `argv` (the arguments after `launch`).

    Raises:
        command_line.UsageError: a missing or bad option, or no command.
    """
    options = Options()
    given = {}
    index = 0
    while index < len(argv) and argv[index].startswith("-"):
        option = argv[index]
        if option in ("-h", "--help"):
            raise HelpRequested()
        if option.split("=")[0] in _ELASTIC:
            raise command_line.UsageError(
                f"launch: {option.split('=')[0]} (a job whose number of processes changes) "
                "is not supported: TensorFlow's collectives fix a job's processes when "
                "they start. Use -np N with --max-restarts K: every process starts "
                "again after a failure, and hvd.elastic.run resumes from the last commit")
        if option not in _VALUED:
            raise command_line.UsageError(f"launch: unknown option {option}\n{usage()}")
        if index + 1 >= len(argv):
            raise command_line.UsageError(f"launch: {option} needs a value\n{usage()}")
        given[_VALUED[option]] = (option, argv[index + 1])
        index += 2
    options.command = argv[index:]
    if not options.command:
        raise command_line.UsageError(f"launch: no command to run\n{usage()}")
    if "processes" not in given:
        raise command_line.UsageError(f"launch: -np N is required\n{usage()}")
    options.processes = _positive_int(*given["processes"])
    options.hosts = _hosts(given["hosts"][1] if "hosts" in given
                           else f"localhost:{options.processes}")
    slots = sum(count for _, count in options.hosts)
    if slots < options.processes:
        raise command_line.UsageError(
            f"launch: -np {options.processes} but the hosts have {slots} slots")
    if "host_index" in given:
        options.host_index = _int_at_least(0, *given["host_index"])
        if options.host_index >= len(options.hosts):
            raise command_line.UsageError(
                f"launch: --host-index {options.host_index}, but -H names "
                f"{len(options.hosts)} host(s)")
    if "port" in given:
        options.port = _int_at_least(1, *given["port"])
    if "grace" in given:
        try:
            options.grace = float(given["grace"][1])
        except ValueError:
            options.grace = -1.0
        if not options.grace >= 0:
            raise command_line.UsageError(
                f"launch: --grace needs seconds (0 or more), found {given['grace'][1]!r}")
    if "max_restarts" in given:
        options.max_restarts = _int_at_least(0, *given["max_restarts"])
        if options.max_restarts and len(options.hosts) > 1:
            raise command_line.UsageError(
                "launch: --max-restarts restarts the processes of one host; with "
                f"{len(options.hosts)} hosts each launcher would restart alone and the "
                "job's processes would not meet again. Let the scheduler restart the "
                "whole job on a failed exit status (Slurm --requeue, Kubernetes "
                "restartPolicy: docs/strategies.md, 'Surviving faults')")
    return options


class HelpRequested(Exception):
    """`launch --help`: print the usage and exit 0."""


def _positive_int(option, text):
    return _int_at_least(1, option, text)


def _int_at_least(least, option, text):
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise command_line.UsageError(
            f"launch: {option} needs a whole number of at least {least}, found {text!r}")
    return value


def _hosts(text):
    """[(name, slots)] from 'host1:2,host2:2' (a host without :slots has 1)."""
    hosts = []
    for entry in text.split(","):
        name, _, slots = entry.strip().partition(":")
        if not name:
            raise command_line.UsageError(
                f"launch: -H {text!r}: expected host:slots,host:slots")
        hosts.append((name, _positive_int(f"-H {name}: slots", slots or "1")))
    if len({name for name, _ in hosts}) != len(hosts):
        raise command_line.UsageError(f"launch: -H {text!r} names a host twice")
    return hosts


@dataclasses.dataclass(frozen=True)
class Placement:
    """One process of the job: its rank and where it runs."""
    rank: int
    host_index: int
    local_rank: int
    local_size: int


def placements(options):
    """Every process of the job, ranks given host by host."""
    found = []
    for host_index, (_, slots) in enumerate(options.hosts):
        local = min(slots, options.processes - len(found))
        found += [Placement(len(found) + local_rank, host_index, local_rank, local)
                  for local_rank in range(local)]
    return found


def this_host(options):
    """The index in -H of the host this launcher starts.

    Raises:
        command_line.UsageError: several hosts and none is named as this
            machine (nor --host-index given).
    """
    if options.host_index is not None:
        return options.host_index
    names = [name for name, _ in options.hosts]
    if len(names) == 1:
        return 0
    mine = {socket.gethostname(), socket.getfqdn(), *LOCAL_NAMES}
    matching = [index for index, name in enumerate(names) if name in mine]
    if len(matching) != 1:
        raise command_line.UsageError(
            f"launch: -H names {len(names)} hosts and "
            f"{'none' if not matching else 'several'} of them is this machine "
            f"({socket.gethostname()}): pass --host-index I on each host")
    return matching[0]


def ports(options, job):
    """The port of each process of `job` (by rank)."""
    if options.port is not None:
        return [options.port + place.local_rank for place in job]
    if len(options.hosts) > 1:
        return [DEFAULT_PORT + place.local_rank for place in job]
    return _free_ports(len(job))


def _free_ports(count):
    """`count` distinct ports free on this host now."""
    sockets = []
    try:
        for _ in range(count):
            bound = socket.socket()
            bound.bind(("localhost", 0))
            sockets.append(bound)
        return [bound.getsockname()[1] for bound in sockets]
    finally:
        for bound in sockets:
            bound.close()


def gpus_here():
    """The GPUs this host offers its processes, as CUDA_VISIBLE_DEVICES
    names them: that variable's list where it is set, else one per line of
    `nvidia-smi -L`; none without either."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [] if visible.strip() in ("", "-1") else [
            item.strip() for item in visible.split(",") if item.strip()]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(index) for index, line in enumerate(
        line for line in listed.splitlines() if line.startswith("GPU "))]


RESTART_COUNT_NAMES = (tf_config.RESTART_COUNT, "TORCHELASTIC_RESTART_COUNT")
"""Where a process finds which attempt of the job it belongs to (0 first)."""
LAUNCH_DIRECTORY = tf_config.LAUNCH_DIRECTORY
"""A directory every attempt of the launch shares."""


def environment(options, job, place, addresses, gpus, attempt=0, launch_directory=None):
    """The environment of process `place` in `attempt` of the launch."""
    hosts = {place.host_index for place in job}
    host_order = sorted(hosts)
    values = {
        "RANK": place.rank, "SIZE": len(job), "LOCAL_RANK": place.local_rank,
        "LOCAL_SIZE": place.local_size,
        "CROSS_RANK": host_order.index(place.host_index), "CROSS_SIZE": len(hosts)}
    env = dict(os.environ)
    for name, value in values.items():
        env[f"TFDTAPE_{name}"] = str(value)
        env[f"HOROVOD_{name}"] = str(value)
    env["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": addresses},
        "task": {"type": "worker", "index": place.rank}})
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = gpus[place.local_rank]
    for name in RESTART_COUNT_NAMES:
        env[name] = str(attempt)
    if launch_directory is not None:
        env[LAUNCH_DIRECTORY] = launch_directory
    return env


def run(argv):
    """Runs `launch`; returns the exit status.

    Raises:
        command_line.UsageError: bad arguments, or more processes on this
            host than it has GPUs.
    """
    try:
        options = parse(argv)
    except HelpRequested:
        print(__doc__.split("\n\n", 1)[1].rstrip())
        print(usage())
        return command_line.EXIT_PASSED
    job = placements(options)
    host = this_host(options)
    local = [place for place in job if place.host_index == host]
    if not local:
        raise command_line.UsageError(
            f"launch: -np {options.processes} places no process on host "
            f"{options.hosts[host][0]}")
    gpus = gpus_here()
    if gpus and len(local) > len(gpus):
        raise command_line.UsageError(
            f"launch: {len(local)} processes on this host but {len(gpus)} GPU(s) "
            "(CUDA_VISIBLE_DEVICES or nvidia-smi): pass -np with at most one "
            "process per GPU, or CUDA_VISIBLE_DEVICES= to run on CPUs")
    launch_directory, made = _launch_directory()
    try:
        for attempt in range(options.max_restarts + 1):
            by_rank = ports(options, job)
            addresses = [f"{options.hosts[place.host_index][0]}:{by_rank[place.rank]}"
                         for place in job]
            status, failed = _supervise(options, [
                (place.rank, environment(options, job, place, addresses, gpus, attempt,
                                         launch_directory))
                for place in local], functools.partial(
                    _say_reachable, [by_rank[place.rank] for place in local], attempt))
            if failed is None or attempt == options.max_restarts:
                return status
            print(f"tfdtape launch: restarting every process (attempt {attempt + 1} of "
                  f"{options.max_restarts})", file=sys.stderr, flush=True)
        return status
    finally:
        if made:
            shutil.rmtree(launch_directory, ignore_errors=True)


def _launch_directory():
    """(the launch's shared directory, whether this launcher made it): the
    environment's TFDTAPE_LAUNCH_DIR where set, else a new temporary one."""
    given = os.environ.get(LAUNCH_DIRECTORY)
    if given:
        os.makedirs(given, exist_ok=True)
        return given, False
    return tempfile.mkdtemp(prefix="tfdtape-launch-"), True


def _say_reachable(local_ports, attempt):
    """Says on stderr which ports this host's processes open (once per
    attempt: a restart may take new ones)."""
    listed = ", ".join(map(str, local_ports))
    if attempt:
        print(f"tfdtape launch: attempt {attempt} listens on port(s) {listed}",
              file=sys.stderr, flush=True)
        return
    print(f"tfdtape launch: the job's processes on this host listen on port(s) {listed} "
          "of every network interface (TensorFlow's gRPC servers, no authentication): "
          "whoever reaches them can run operations in the job. Run jobs on trusted "
          "networks only.", file=sys.stderr, flush=True)


def _supervise(options, processes, started_all):
    """Starts each (rank, environment) process of `options.command` (then
    calls `started_all()`), copies its output prefixed with its rank, and
    ends them all when one fails; returns (the exit status, the failed rank
    or None)."""
    lock = threading.Lock()
    started = []
    try:
        for rank, env in processes:
            started.append((rank, subprocess.Popen(
                options.command, env=env, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True)))
    except OSError as error:
        _stop(started, options.grace)
        raise command_line.UsageError(
            f"launch: cannot start {options.command[0]!r}: "
            f"{error.strerror or error}") from None
    started_all()
    copiers = [threading.Thread(target=_copy, args=(stream, rank, name, sink, lock),
                                daemon=True)
               for rank, process in started
               for stream, name, sink in ((process.stdout, "stdout", sys.stdout),
                                          (process.stderr, "stderr", sys.stderr))]
    for copier in copiers:
        copier.start()
    previous = {number: signal.signal(number, _raise_interrupt)
                for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        status, failed = _wait_for_all_or_first_failure(started)
    except KeyboardInterrupt:
        status, failed = 128 + signal.SIGINT, None
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    _stop(started, options.grace)
    for copier in copiers:
        copier.join(timeout=5)
    if failed is not None:
        print(f"tfdtape launch: rank {failed} exited with status {status}; the "
              "other processes were stopped", file=sys.stderr, flush=True)
    elif status:
        print("tfdtape launch: interrupted; the processes were stopped",
              file=sys.stderr, flush=True)
    return status, failed


def _raise_interrupt(number, _frame):
    raise KeyboardInterrupt()


def _wait_for_all_or_first_failure(started):
    """(0, None) once every process exited 0; else the first failure's
    (status, rank)."""
    pending = list(started)
    while pending:
        for rank, process in list(pending):
            status = _status(process)
            if status is None:
                continue
            if status:
                return status, rank
            pending.remove((rank, process))
        if pending:
            time.sleep(0.05)
    return 0, None


def _status(process):
    """A finished process's exit status (128 + signal for a signal), else
    None."""
    code = process.poll()
    if code is None:
        return None
    return 128 - code if code < 0 else code


def _stop(started, grace):
    """SIGTERM to every process still running (its whole process group),
    SIGKILL to those left after `grace` seconds."""
    running = [process for _, process in started if process.poll() is None]
    for process in running:
        _signal_group(process, signal.SIGTERM)
    for process in running:
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait()


def _signal_group(process, number):
    try:
        os.killpg(process.pid, number)
    except (ProcessLookupError, PermissionError):
        pass


def _copy(stream, rank, name, sink, lock):
    """Copies `stream` to `sink` line by line, each prefixed with the rank."""
    prefix = f"[{rank}]<{name}>:"
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", errors="replace")
        with lock:
            sink.write(prefix + line if line.endswith("\n") else prefix + line + "\n")
            sink.flush()
    stream.close()
