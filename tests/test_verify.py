"""`python -m tfdtape verify|info`: the checks, their verdicts and the reports."""

import functools
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

import pytest

from tfdtape import checks
from tfdtape import testing
from tfdtape import tape_functions
from tfdtape import verify
from tfdtape.__main__ import main

CHECK_NAMES = [check.name for check in checks.CHECKS]


def run_cli(*args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    completed = subprocess.run([sys.executable, "-m", "tfdtape", *args],
                               env=env, capture_output=True, text=True,
                               timeout=600)
    return completed.returncode, completed.stdout, completed.stderr


@pytest.mark.parametrize("check", checks.CHECKS, ids=CHECK_NAMES)
def test_every_check_passes_here(strategy, check):
    result = verify.run_check(check, strategy)
    assert result.status == verify.PASS, result.message
    assert result.observations["tfdtape_alone"] == check.expected
    if check.discriminating:
        assert result.observations["pre_seed"] != check.expected


def test_broken_resolution_fails_with_a_useful_message(strategy, monkeypatch):
    """tfdtape's tape functions watching components, as before the commit."""
    monkeypatch.setattr(tape_functions, "_resolve", lambda variable: (
        variable,))
    result = verify.run_check(checks.CHECKS[0], strategy)
    assert result.status == verify.FAIL
    assert result.observations["tfdtape_alone"] == "own component"
    assert ("tfdtape_alone: expected 'container', observed 'own component'"
            in result.message)
    line = verify.result_line(result, 30)
    assert "FAIL" in line and "-> tfdtape" in line


def test_a_check_the_control_passes_is_not_discriminating(strategy):
    always = checks.Check("always", "observes the same everywhere",
                          lambda strategy: "same", "same")
    result = verify.run_check(always, strategy)
    assert result.status == verify.NOT_DISCRIMINATING
    assert "cannot tell tfdtape from no tfdtape" in result.message


def test_cli_verify_passes_and_writes_reports(tmp_path):
    json_path, junit_path = tmp_path / "verify.json", tmp_path / "verify.xml"
    code, out, err = run_cli("verify", "--replicas", "2", "--json",
                             str(json_path), "--junit", str(junit_path))
    assert code == 0, out + err
    lines = out.splitlines()
    for name in CHECK_NAMES:
        assert any(line.startswith(name) and " PASS " in line for line in lines), name
    assert f"{len(CHECK_NAMES)}/{len(CHECK_NAMES)} checks passed" in out
    assert "devices: 2 logical CPUs" in out
    assert (f"TensorFlow's native resolver: "
            f"{testing.native_resolution_description()}") in out

    report = json.loads(json_path.read_text())
    assert report["passed"] is True
    assert [c["name"] for c in report["checks"]] == CHECK_NAMES
    assert report["environment"]["devices"] == ["/device:CPU:0", "/device:CPU:1"]
    assert report["checks"][0]["observations"]["pre_seed"] == "own component"

    suite = ElementTree.parse(junit_path).getroot().find("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == 4 * len(CHECK_NAMES) == int(suite.get("tests"))
    assert suite.get("failures") == "0"
    assert {case.get("name") for case in cases} == {
        "stock", "tfdtape", "tfdtape_alone", "pre_seed"}


def test_cli_only_and_list():
    code, out, _ = run_cli("verify", "--list")
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == CHECK_NAMES
    code, out, _ = run_cli("verify", "--only", "cross_replica_gradient")
    assert code == 0
    assert out.splitlines()[0].startswith("cross_replica_gradient")
    assert "1/1 checks passed" in out


@pytest.mark.parametrize("args, message", [
    (["verify", "--only", "nonsense"], "tfdtape: unknown check nonsense"),
    (["verify", "--replicas", "1"], "tfdtape: --replicas must be between 2 and 64, found 1"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_cli_bad_arguments_exit_2_without_traceback(args, message):
    code, out, err = run_cli(*args)
    assert code == 2
    assert message in err
    assert "Traceback" not in err


@pytest.mark.parametrize("module_text, message", [
    ("raise ImportError('No module named tensorflow (blocked)')\n",
     "tfdtape: TensorFlow cannot be imported (No module named tensorflow "
     "(blocked)). Install it with `pip install tfdtape[cpu]`"),
    ("__version__ = '2.11.0'\n",
     "tfdtape: TensorFlow 2.11.0 is not supported: expected a release in "
     ">=2.12,<2.22"),
], ids=["no tensorflow", "unsupported tensorflow"])
def test_cli_unusable_tensorflow_exits_2(tmp_path, module_text, message):
    (tmp_path / "tensorflow.py").write_text(module_text)
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}"
               + os.environ.get("PYTHONPATH", ""))
    completed = subprocess.run([sys.executable, "-m", "tfdtape", "verify"],
                               env=env, capture_output=True, text=True,
                               timeout=300)
    assert completed.returncode == 2
    assert completed.stderr.startswith(message), completed.stderr
    assert "Traceback" not in completed.stderr


def test_in_process_verify_uses_a_fresh_process_for_another_layout(capfd):
    """This process has 4 CPUs; asking for 3 re-runs in a subprocess."""
    assert main(["verify", "--replicas", "3", "--only",
                 "replica_context_eager"]) == 0
    out = capfd.readouterr().out
    assert "devices: 3 logical CPUs" in out


def test_cli_info():
    code, out, _ = run_cli("info")
    assert code == 0
    assert "defun captured-input resolution: absent" in out
    assert "install check: OK" in out
    assert ("tensorflow.python.eager.tape.watch_variable: TensorFlow's "
            "original; patched on install") in out


def break_resolution(monkeypatch, strategy):
    monkeypatch.setattr(tape_functions, "_resolve", lambda variable: (variable,))
    return strategy


def break_total(monkeypatch, strategy):
    from tfdtape import gradient_tape
    monkeypatch.setattr(gradient_tape, "_total", lambda gradients: gradients[0])
    return strategy


def break_sync_on_read_check(monkeypatch, strategy):
    from tfdtape import gradient_tape
    monkeypatch.setattr(gradient_tape, "_check_differentiable_across_replicas",
                        lambda variable: None)
    return strategy


def break_distributed_source_detection(monkeypatch, strategy):
    from tfdtape import gradient_tape
    monkeypatch.setattr(gradient_tape, "_is_distributed_source", lambda source: False)
    return strategy


def break_unrecorded_read_check(monkeypatch, strategy):
    from tfdtape import unrecorded_reads
    monkeypatch.setattr(unrecorded_reads, "check", lambda *args: None)
    return strategy


def use_a_strategy_that_does_not_mirror(monkeypatch, strategy):
    import tensorflow as tf
    return tf.distribute.get_strategy()


def leave_captured_input_resolution(monkeypatch, strategy):
    """A function class that still resolves, and a tfdtape that keeps it."""
    from tfdtape import defun

    class ResolvingFunction:
        def _resolve_captured_inputs(self):
            return []

    monkeypatch.setattr(defun, "classes_with_captured_input_resolution",
                        lambda: [ResolvingFunction])
    monkeypatch.setattr(defun, "make_resolver_replacement", lambda original: original)
    return strategy


def break_uninstall(monkeypatch, strategy):
    """install() records copies as the originals, so uninstall() restores
    copies. monkeypatch.undo() puts back the real state afterwards."""
    from tfdtape import patching
    from tfdtape import targets
    monkeypatch.setattr(patching, "_applied", patching._applied)
    for target in targets.patch_targets():
        monkeypatch.setattr(target.owner, target.attribute, target.current())
    real_check = targets.PatchTarget.check

    def check_and_copy(self):
        original = real_check(self)

        @functools.wraps(original)
        def copy(*args, **kwargs):
            return original(*args, **kwargs)
        return copy

    monkeypatch.setattr(targets.PatchTarget, "check", check_and_copy)
    return strategy


BREAKERS = {
    "replica_context_eager": (break_resolution, "'own component'"),
    "replica_context_tf_function": (break_resolution, "'own component'"),
    "watched_variables_reset": (break_resolution, "'own component'"),
    "captured_variable_tf_function": (break_resolution,
                                      "'own component read, own component'"),
    "cross_replica_tape_call": (break_resolution, "'raised SystemError"),
    "cross_replica_watch": (break_resolution, "'raised SystemError"),
    "cross_replica_gradient": (break_total, "'gradient 1'"),
    "sync_on_read_gradient_error": (break_sync_on_read_check, "'no error'"),
    "keras_cross_replica_gradient": (
        break_distributed_source_detection,
        "'raised ValueError: DistributedVariable.handle is not available"),
    "strategy_run_under_cross_replica_tape": (break_unrecorded_read_check,
                                              "'gradient None'"),
    "variable_creator_stack": (use_a_strategy_that_does_not_mirror,
                               "'UnliftedInitializerVariable'"),
    "defun_captured_input_resolution": (
        leave_captured_input_resolution,
        "'per-call resolution in leave_captured_input_resolution.<locals>."
        "ResolvingFunction'"),
    "uninstall_restores_identity": (break_uninstall, "'originals lost'"),
}


def test_every_check_has_a_fail_path():
    assert sorted(BREAKERS) == sorted(CHECK_NAMES)


@pytest.mark.parametrize("check", checks.CHECKS, ids=CHECK_NAMES)
def test_each_check_fails_when_its_behaviour_breaks(strategy, monkeypatch, check):
    breaker, observed = BREAKERS[check.name]
    broken_strategy = breaker(monkeypatch, strategy)
    result = verify.run_check(check, broken_strategy)
    monkeypatch.undo()
    assert result.status == verify.FAIL
    assert result.message.startswith(
        f"tfdtape: expected {check.expected!r}, observed {observed}")
