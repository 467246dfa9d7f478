"""`python -m tfdtape verify|info`: the checks, their verdicts and the reports."""

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

import pytest

from tfdtape import checks
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
    assert "native resolver (tape.register_watched_variable_resolver): present" in out

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


def test_cli_without_tensorflow_exits_2(tmp_path):
    blocker = tmp_path / "tensorflow.py"
    blocker.write_text("raise ImportError('No module named tensorflow (blocked)')\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}"
               + os.environ.get("PYTHONPATH", ""))
    completed = subprocess.run([sys.executable, "-m", "tfdtape", "verify"],
                               env=env, capture_output=True, text=True,
                               timeout=300)
    assert completed.returncode == 2
    assert completed.stderr.startswith("tfdtape: TensorFlow cannot be imported")
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
