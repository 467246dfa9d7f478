"""Worker processes on loopback for the multi-process tests: free ports,
and a cluster run with a hard time limit."""

import contextlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import exercise_recorder

TESTS = pathlib.Path(__file__).parent


def free_ports(count):
    """`count` distinct 127.0.0.1 ports that were free a moment ago.

    All are held open together while picking, so they differ; a port can still
    be taken by another process before the caller binds it.
    """
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


def worker_configs(count):
    """TF_CONFIG of each worker of a `count`-worker cluster on fresh ports."""
    ports = free_ports(count)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    return [{"cluster": cluster, "task": {"type": "worker", "index": index}}
            for index in range(count)]


def launched_outputs(stdout, starts="{"):
    """rank -> the JSON each process of `tfdtape launch` printed last (its
    lines prefixed `[rank]<stdout>:`), of those starting with `starts`."""
    found = {}
    for line in stdout.splitlines():
        prefix, _, text = line.partition("<stdout>:")
        if text.startswith(starts):
            found[int(prefix.strip("[]"))] = json.loads(text)
    return found


def run_processes(tf_configs, arguments, time_limit, env=None, envs=None):
    """Runs `python ARGUMENTS...` once per TF_CONFIG (None: no cluster), all
    at once, with tests/ on PYTHONPATH (and `envs[i]`, where given, in the
    i-th process's environment); returns the JSON each printed last, in
    order. Under `pytest --record-exercise` a script runs recorded
    (tests/recorded_process.py).

    Every process is killed once `time_limit` seconds have passed since the
    start (a cluster whose workers wait on each other would hang: they are
    sent SIGABRT first, so that faulthandler prints where each thread was),
    and then, or if one fails, the call fails with the end of what they
    wrote on stderr.
    """
    processes = []
    deadline = time.monotonic() + time_limit
    try:
        for index, tf_config in enumerate(tf_configs):
            environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONFAULTHANDLER="1",
                               **(env or {}),
                               **(envs[index] if envs else {}), PYTHONPATH=os.pathsep.join(
                                   [str(TESTS), os.environ.get("PYTHONPATH", "")]))
            environment.pop("TF_CONFIG", None)
            if tf_config is not None:
                environment["TF_CONFIG"] = json.dumps(tf_config)
            recorded = (exercise_recorder.ENVIRONMENT in environment and
                        arguments[0] not in ("-m", "-c"))
            processes.append(subprocess.Popen(
                [sys.executable, *([str(TESTS / "recorded_process.py")] if recorded else []),
                 *arguments], env=environment,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outputs = []
        for process in processes:
            try:
                outputs.append(process.communicate(
                    timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                for other in processes[len(outputs):]:  # faulthandler prints the stacks
                    other.send_signal(signal.SIGABRT)
                grace = time.monotonic() + 10
                for other in processes[len(outputs):]:
                    outputs.append(_output_after_abort(other, grace))
                raise AssertionError(
                    f"the cluster ran past its time limit of {time_limit} s: every worker "
                    "was stopped; their exit statuses and the end of their stderr:\n" +
                    "\n".join(f"--- worker {index} ({process.returncode}):\n{err[-3000:]}"
                               for index, (process, (_, err)) in
                               enumerate(zip(processes, outputs)))) from None
        for process, (_, err) in zip(processes, outputs):
            assert process.returncode == 0, err[-3000:]
        return [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def _output_after_abort(process, grace):
    """(stdout, stderr) of a worker sent SIGABRT: what it wrote by `grace`
    (a monotonic deadline), else killed; a pipe that a process it started
    still holds open is given up after 5 s more."""
    try:
        return process.communicate(timeout=max(0.1, grace - time.monotonic()))
    except subprocess.TimeoutExpired:
        process.kill()
    try:
        return process.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        return "", "(its pipes are held open by a process it started)"
