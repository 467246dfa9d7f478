"""tfdtape across importlib.reload and os.fork, each in a fresh interpreter.

Both run in the three configurations of test_coexistence (stock,
tfdtape_alone, pre_seed): one subprocess per kind runs all three and reports
what it observed as JSON.
"""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.per_release

CONFIGURATIONS = ("stock", "tfdtape_alone", "pre_seed")

COMMON = """
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
import tfdtape
from tfdtape import targets, testing

def holders():
    return {t.symbol: t.current() for t in targets.patch_targets()}

def without_tfdtape():
    return {s: targets.original_of(h) or h for s, h in holders().items()}

def same(found, expected):
    return found.keys() == expected.keys() and all(
        found[s] is expected[s] for s in expected)
"""

RELOAD = COMMON + """
import importlib, pkgutil
MODULES = ["tfdtape"] + sorted(
    info.name for info in pkgutil.walk_packages(tfdtape.__path__, "tfdtape."))
for name in MODULES:
    importlib.import_module(name)

def reload_and_observe(name, before, tensorflow, installed):
    importlib.reload(sys.modules[name])
    patching = sys.modules["tfdtape.patching"]
    seen = {"installed after reload": patching.is_installed(),
            "holders kept": same(holders(), before)}
    with patching.patched():
        inside = holders()
        importlib.reload(sys.modules[name])
        patching = sys.modules["tfdtape.patching"]
        seen["installed after reload in a block"] = patching.is_installed()
        seen["holders kept in the block"] = same(holders(), inside)
        seen["install in the block returned"] = patching.install()
        try:
            patching.uninstall()
            seen["uninstall in the block"] = "returned"
        except RuntimeError as error:
            seen["uninstall in the block"] = type(error).__name__
    seen["state before the block restored"] = same(holders(), before)
    seen["install returned"] = patching.install()
    seen["originals recorded are TensorFlow's"] = all(
        targets.original_of(h) is tensorflow[s] for s, h in holders().items())
    seen["uninstall returned"] = patching.uninstall()
    seen["TensorFlow's originals restored"] = same(holders(), tensorflow)
    if installed:
        patching.install()
    return seen


report = {}
for configuration in %(configurations)r:
    for name in MODULES:
        with testing.configuration(configuration):
            installed = tfdtape.is_installed()
            report.setdefault(configuration, {})[name] = reload_and_observe(
                name, holders(), without_tfdtape(), installed)
print(json.dumps(report))
"""

FORK = COMMON + """
import select, signal, threading
from tensorflow.python.eager import tape as tape_module
from tfdtape import events, patching

variable = tf.Variable(1.0)


def in_child_inside_blocks(trace):
    seen = {"trace active": events.active}
    recorded_before = len(trace.events)
    tape_module.variable_accessed(variable)
    seen["events recorded after fork"] = len(trace.events) - recorded_before
    try:
        tfdtape.uninstall()
        seen["uninstall inside its block"] = "returned"
    except tfdtape.PatchInUseError as error:
        seen["uninstall inside its block"] = (
            str(error).split(": expected ")[1].split(" in TensorFlow")[0])
    return seen


def in_child_after_blocks(seen, before, tensorflow):
    seen["state before the first block restored"] = same(holders(), before)
    seen["installed"] = tfdtape.is_installed()
    seen["uninstall returned"] = tfdtape.uninstall()
    seen["TensorFlow's originals restored"] = same(holders(), tensorflow)
    seen["install returned"] = tfdtape.install()
    return seen


def wait_for(pid, pipe):
    ready, _, _ = select.select([pipe], [], [], 60)
    if not ready:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return {"hung": True}
    data = b""
    while chunk := os.read(pipe, 65536):
        data += chunk
    _, status = os.waitpid(pid, 0)
    return {**json.loads(data or b"{}"), "exit status": status}


report = {}
for configuration in %(configurations)r:
    with testing.configuration(configuration):
        before, tensorflow = holders(), without_tfdtape()
        in_block, holding, release = (threading.Event() for _ in range(3))

        def open_block():
            with tfdtape.patched():
                in_block.set()
                release.wait()

        def hold_lock():
            with patching._state.lock:
                holding.set()
                release.wait()

        threads = [threading.Thread(target=open_block),
                   threading.Thread(target=hold_lock)]
        threads[0].start()
        in_block.wait()
        with tfdtape.trace() as trace, tfdtape.patched():
            threads[1].start()
            holding.wait()
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read_end)
                child = in_child_inside_blocks(trace)
            else:
                os.close(write_end)
                parent = {"child": wait_for(pid, read_end)}
                release.set()
                recorded_before = len(trace.events)
                tape_module.variable_accessed(variable)
                parent["parent's trace still records"] = len(trace.events) - recorded_before
        if pid == 0:
            try:
                child = in_child_after_blocks(child, before, tensorflow)
                os.write(write_end, json.dumps(child).encode())
            finally:
                os._exit(0)
        for thread in threads:
            thread.join()
        parent["parent's state before the first block restored"] = same(
            holders(), before)
    report[configuration] = parent
print(json.dumps(report))
"""


EVERY_LOCK = COMMON + """
import importlib, pkgutil, select, signal, threading, types
from tfdtape import events
from tfdtape.cli import event_counts

for info in pkgutil.walk_packages(tfdtape.__path__, "tfdtape."):
    if not info.name.endswith("__main__"):
        importlib.import_module(info.name)
LOCKS = (type(threading.Lock()), type(threading.RLock()))


def tfdtapes_locks():
    # Every lock reachable from tfdtape's modules, the import finders and
    # the open sinks: through containers, namespaces and tfdtape's objects.
    found, seen = {}, set()

    def walk(value, path, depth):
        if id(value) in seen or depth > 5:
            return
        seen.add(id(value))
        if isinstance(value, LOCKS):
            found[id(value)] = (path, value)
            return
        if isinstance(value, dict):
            items = list(value.items())
        elif isinstance(value, (list, tuple, set, frozenset)):
            items = list(enumerate(value))
        elif isinstance(value, types.SimpleNamespace) or (
                type(value).__module__ or "").startswith("tfdtape"):
            items = list(getattr(value, "__dict__", {}).items())
        else:
            return
        for key, item in items:
            walk(item, f"{path}.{key}", depth + 1)

    for name, module in list(sys.modules.items()):
        if name == "tfdtape" or name.startswith("tfdtape."):
            for key, value in list(vars(module).items()):
                walk(value, f"{name}.{key}", 0)
    for index, finder in enumerate(sys.meta_path):
        walk(finder, f"sys.meta_path[{index}]", 0)
    return sorted(found.values(), key=lambda item: item[0])


def in_child(trace, strategy):
    events_at_fork = len(trace.events)
    seen = {}
    with tf.GradientTape() as tape:
        y = variable * variable
    seen["gradient in the child"] = float(tape.gradient(y, variable))
    with strategy.scope():
        mirrored = tf.Variable(2.0)
        with tf.GradientTape() as tape:
            per_replica = strategy.run(lambda: mirrored * 3.0)
            total = strategy.reduce("SUM", per_replica, axis=None)
        seen["spanning gradient in the child"] = float(tape.gradient(total, mirrored))
    with tfdtape.trace() as fresh:
        with tf.GradientTape() as tape:
            tape.watch(variable)
    seen["events of a trace opened in the child"] = len(fresh.events)
    seen["events the inherited trace got"] = len(trace.events) - events_at_fork
    return seen


report = {}
for configuration in ("tfdtape", "tfdtape_alone"):
  with testing.configuration(configuration):
    variable = tf.Variable(3.0)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    sink = event_counts.EventCounts()
    events.open_sink(sink)
    holding, recording, release = (threading.Event() for _ in range(3))
    with tfdtape.trace() as trace:
        locks = tfdtapes_locks()

        def hold_every_lock():
            for _, lock in locks:
                lock.acquire()
            holding.set()
            release.wait()
            for _, lock in reversed(locks):
                lock.release()

        def record_a_tape():
            with tf.GradientTape() as tape:
                tape.watch(variable)
                recording.set()
                release.wait()

        threads = [threading.Thread(target=record_a_tape),
                   threading.Thread(target=hold_every_lock)]
        for thread, started in zip(threads, (recording, holding)):
            thread.start()
            started.wait()
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            try:
                seen = in_child(trace, strategy)
            except BaseException as error:
                seen = {"error": repr(error)}
        else:
            os.close(write_end)
            ready, _, _ = select.select([read_end], [], [], 120)
            if ready:
                data = b""
                while chunk := os.read(read_end, 65536):
                    data += chunk
                child = json.loads(data or b"{}")
            else:
                os.kill(pid, signal.SIGKILL)
                child = {"hung": True}
            os.waitpid(pid, 0)
            release.set()
            for thread in threads:
                thread.join()
    if pid == 0:  # The child closed the inherited trace too.
        seen["closed the inherited trace"] = True
        try:
            os.write(write_end, json.dumps(seen).encode())
        finally:
            os._exit(0)
    events.close_sink(sink)
    report[configuration] = {"locks": [path for path, _ in locks], "child": child}
print(json.dumps(report))
"""


def run_script(script):
    """Runs `script` in a fresh interpreter; returns the JSON it printed."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TFDTAPE_AUTOINSTALL="0")
    completed = subprocess.run(
        [sys.executable, "-c", script % {"configurations": CONFIGURATIONS}],
        env=env, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def reloads():
    """{configuration: {module: observations}} after reloading each module."""
    return run_script(RELOAD)


@pytest.fixture(scope="module")
def forks():
    """{configuration: observations} of a fork with the lock held."""
    return run_script(FORK)


@pytest.mark.parametrize("configuration", CONFIGURATIONS)
def test_reloading_any_module_keeps_tensorflows_originals(reloads, configuration):
    installed = configuration == "tfdtape_alone"
    observed = reloads[configuration]
    assert len(observed) > 10 and "tfdtape.patching" in observed
    for module, seen in observed.items():
        assert seen == {
            "installed after reload": installed,
            "holders kept": True,
            "installed after reload in a block": True,
            "holders kept in the block": True,
            "install in the block returned": False,
            "uninstall in the block": "PatchInUseError",
            "state before the block restored": True,
            "install returned": not installed,
            "originals recorded are TensorFlow's": True,
            "uninstall returned": True,
            "TensorFlow's originals restored": True,
        }, module


@pytest.mark.parametrize("configuration", CONFIGURATIONS)
def test_a_fork_with_the_lock_held_leaves_the_child_working(forks, configuration):
    assert forks[configuration] == {
        "child": {
            "trace active": False,
            "events recorded after fork": 0,
            "uninstall inside its block": "no open tfdtape.patched() block, found 1 open",
            "state before the first block restored": True,
            "installed": configuration == "tfdtape_alone",
            "uninstall returned": configuration == "tfdtape_alone",
            "TensorFlow's originals restored": True,
            "install returned": True,
            "exit status": 0,
        },
        "parent's trace still records": 1,
        "parent's state before the first block restored": True,
    }


@pytest.fixture(scope="module")
def fork_with_every_lock_held():
    """{configuration: {"locks": paths, "child": observations}} of a fork
    while another thread holds every tfdtape lock, a trace and a run
    recorder are open and a third thread's tape records."""
    return run_script(EVERY_LOCK)


@pytest.mark.parametrize("configuration", ["tfdtape", "tfdtape_alone"])
def test_a_fork_with_every_lock_held_leaves_the_child_working(
        fork_with_every_lock_held, configuration):
    observed = fork_with_every_lock_held[configuration]
    # The patch lock, the event bus's, and one per watch for a Keras module
    # imported later (the run recorder's is reached through the open sinks).
    assert {"tfdtape.patching._state.lock", "tfdtape.events._lock",
            "tfdtape.events._open_sinks.0._lock"} <= set(observed["locks"])
    assert any(".late_imports._watches." in path for path in observed["locks"])
    assert observed["child"] == {
        "gradient in the child": 6.0,
        "spanning gradient in the child": 3.0,
        "events of a trace opened in the child": 1,
        "events the inherited trace got": 0,
        "closed the inherited trace": True,
    }
