"""The untested-release policy: an untested TensorFlow (older, newer, a
development build, a pre-release) is refused unless
TFDTAPE_ALLOW_UNTESTED_TENSORFLOW=1, which installs after the structural
checks with one WARNING; verify runs every check anyway and says so.

Releases are made untested here by changing `tf.__version__`: in-process
with monkeypatch, in subprocesses by a sitecustomize that sets it before
the program runs (importing TensorFlow starts no runtime, so verify can still
lay out its devices).
"""

import json
import logging
import os
import subprocess
import sys

import pytest
import tensorflow as tf
from tensorflow.python.eager import tape as tape_module

import tfdtape
from tfdtape import patching
from tfdtape import release_policy
from tfdtape import versions
from tfdtape.cli import command_line
from tfdtape.cli import run_session

OPT_IN = "TFDTAPE_ALLOW_UNTESTED_TENSORFLOW"
NIGHTLY = "2.23.0-dev20261026"


def refusal_text(version, reason):
    return (
        "tfdtape: untested TensorFlow release (tensorflow.__version__): "
        f"expected final releases >=2.12,<2.22, found {version} ({reason}) "
        f"in TensorFlow {version}. Install tensorflow-cpu>=2.12,<2.22 (or "
        f"tensorflow), or set {OPT_IN}=1 to install on this release anyway "
        "(tfdtape still checks every function it patches first; `python -m "
        "tfdtape verify` tells whether the patch holds there).")


@pytest.mark.parametrize("version, reason", [
    ("2.21.0", None),
    ("2.12.1", None),
    ("2.11.1", "older than the tested range"),
    ("2.22.0", "newer than the tested range"),
    (NIGHTLY, "a development build, newer than the tested range"),
    ("2.21.0-dev20250101", "a development build"),
    ("2.21.0rc1", "a pre-release"),
    ("nonsense", "not a release number"),
])
def test_untested_reason(version, reason):
    assert versions.untested_reason(version) == reason
    assert versions.is_tested(version) is (reason is None)


@pytest.fixture
def untested(monkeypatch):
    """tfdtape uninstalled, TensorFlow calling itself a nightly, the opt-in
    unset, no acceptance in this process (an in-process `verify` makes
    one) and the WARNING not yet given in this process."""
    monkeypatch.delenv(OPT_IN, raising=False)
    monkeypatch.setattr(release_policy, "_accepted_here", False)
    monkeypatch.setattr(patching._state, "untested_logged", False)
    tfdtape.uninstall()
    monkeypatch.setattr(tf, "__version__", NIGHTLY)
    yield
    monkeypatch.undo()
    tfdtape.uninstall()
    tfdtape.install()


@pytest.mark.parametrize("version, reason", [
    ("2.11.1", "older than the tested range"),
    (NIGHTLY, "a development build, newer than the tested range"),
    ("2.21.0rc1", "a pre-release"),
])
def test_untested_release_is_refused_by_default(untested, monkeypatch, version,
                                                reason):
    monkeypatch.setattr(tf, "__version__", version)
    with pytest.raises(tfdtape.UnsupportedTensorFlowError) as raised:
        tfdtape.install()
    assert str(raised.value) == refusal_text(version, reason)
    assert not tfdtape.is_installed()


def test_opt_in_installs_with_one_warning(untested, monkeypatch, caplog):
    monkeypatch.setenv(OPT_IN, "1")
    with caplog.at_level(logging.WARNING, logger="tfdtape"):
        assert tfdtape.install() is True
        assert tfdtape.uninstall() is True
        assert tfdtape.install() is True
    assert tfdtape.is_installed()
    assert [(record.levelname, record.getMessage())
            for record in caplog.records] == [(
                "WARNING",
                f"tfdtape: installed although TensorFlow {NIGHTLY} is untested "
                "(a development build, newer than the tested range; tested: "
                "final releases >=2.12,<2.22). Run `python -m tfdtape verify` "
                "to check the patch on this build")]


def test_opt_in_still_refuses_a_failing_structural_check(untested, monkeypatch):
    monkeypatch.setenv(OPT_IN, "yes")
    monkeypatch.delattr(tape_module, "variable_accessed")
    with pytest.raises(tfdtape.UnsupportedTensorFlowError) as raised:
        tfdtape.install()
    assert str(raised.value).startswith(
        "tfdtape: a function tfdtape patches is missing "
        "(tensorflow.python.eager.tape.variable_accessed)")
    assert not tfdtape.is_installed()


def test_an_unreadable_opt_in_is_an_error(untested, monkeypatch):
    monkeypatch.setenv(OPT_IN, "maybe")
    with pytest.raises(ValueError) as raised:
        tfdtape.install()
    assert str(raised.value) == (
        f"tfdtape: {OPT_IN}='maybe' is not understood: expected one of 0, 1, "
        "false, no, off, on, true, yes. Set it to 1 to install tfdtape on an "
        "untested TensorFlow release")
    assert not tfdtape.is_installed()


def test_a_tested_release_ignores_the_opt_in(untested, monkeypatch):
    monkeypatch.setattr(tf, "__version__", "2.21.0")
    monkeypatch.setenv(OPT_IN, "maybe")  # never read on a tested release
    assert tfdtape.install() is True


def test_run_refuses_an_untested_release_before_importing_internals(
        monkeypatch):
    monkeypatch.delenv(OPT_IN, raising=False)
    monkeypatch.setattr(tf, "__version__", "2.11.0")
    with pytest.raises(command_line.UsageError) as raised:
        run_session._check_policy("2.11.0")
    assert "tfdtape: " + str(raised.value) == refusal_text(
        "2.11.0", "older than the tested range")
    monkeypatch.setenv(OPT_IN, "1")
    run_session._check_policy("2.11.0")


def posing_as(tmp_path, version):
    """An environment whose sitecustomize makes TensorFlow report `version`."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os\n"
        "os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')\n"
        "import tensorflow\n"
        f"tensorflow.__version__ = {version!r}\n")
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
                       PYTHONPATH=os.pathsep.join(
                           filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    environment.pop(OPT_IN, None)
    environment.pop("TF_CONFIG", None)
    return environment


def tfdtape_lines(stderr):
    """The lines of stderr that tfdtape wrote (TensorFlow's start-up
    chatter left out)."""
    return [line for line in stderr.splitlines() if "tfdtape" in line]


def python(arguments, environment, cwd=None):
    return subprocess.run([sys.executable, *arguments], env=environment,
                          capture_output=True, text=True, timeout=600, cwd=cwd)


def test_import_tfdtape_on_an_untested_release(tmp_path):
    environment = posing_as(tmp_path, NIGHTLY)
    refused = python(["-c", "import tfdtape"], environment)
    assert refused.returncode == 1
    assert refused.stderr.splitlines()[-1] == (
        "tfdtape.errors.UnsupportedTensorFlowError: " + refusal_text(
            NIGHTLY, "a development build, newer than the tested range"))
    accepted = python(["-c", "import tfdtape\nprint(tfdtape.is_installed())"],
                      dict(environment, **{OPT_IN: "1"}))
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout == "True\n"
    assert tfdtape_lines(accepted.stderr) == [
        f"tfdtape: installed although TensorFlow {NIGHTLY} is untested (a "
        "development build, newer than the tested range; tested: final "
        "releases >=2.12,<2.22). Run `python -m tfdtape verify` to check the "
        "patch on this build"]


def test_verify_on_an_untested_release_runs_every_check(tmp_path):
    environment = posing_as(tmp_path, NIGHTLY)
    report = tmp_path / "report.json"
    completed = python(["-m", "tfdtape", "verify", "--only",
                        "replica_context_eager", "--only", "cross_replica_watch",
                        "--json", str(report)], environment)
    assert completed.returncode == 0, completed.stderr
    assert tfdtape_lines(completed.stderr) == []  # the header says it all
    lines = completed.stdout.splitlines()
    assert lines[:2] == [
        f"TensorFlow {NIGHTLY}: untested (a development build, newer than "
        "the tested range)",
        "tested: final releases >=2.12,<2.22; verify runs every check anyway"]
    assert [line.split()[:2] for line in lines[2:4]] == [
        ["replica_context_eager", "PASS"], ["cross_replica_watch", "PASS"]]
    assert f"TensorFlow {NIGHTLY} (untested), Python" in completed.stdout
    assert max(map(len, lines)) <= 100
    written = json.loads(report.read_text())
    assert written["environment"]["tensorflow_untested"] == (
        "a development build, newer than the tested range")
    assert written["passed"] is True


def test_verify_on_an_untested_release_fails_as_its_checks_do(tmp_path):
    """The exit status is the checks': one broken check, exit 1."""
    program = ("import sys\n"
               "from tfdtape import tape_functions\n"
               "tape_functions._resolve = lambda variable: (variable,)\n"
               "from tfdtape.__main__ import main\n"
               "sys.exit(main(['verify', '--only', 'replica_context_eager']))\n")
    environment = dict(posing_as(tmp_path, "2.11.1"), TFDTAPE_AUTOINSTALL="0")
    completed = python(["-c", program], environment)
    assert completed.returncode == 1, completed.stderr
    assert completed.stdout.splitlines()[0] == (
        "TensorFlow 2.11.1: untested (older than the tested range)")
    assert completed.stdout.splitlines()[2].startswith(
        "replica_context_eager  FAIL")


def test_info_reports_an_untested_release(tmp_path):
    environment = posing_as(tmp_path, NIGHTLY)
    completed = python(["-m", "tfdtape", "info"], environment)
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert lines[2] == (
        f"TensorFlow {NIGHTLY} is untested (a development build, newer than "
        f"the tested range; tested: final releases >=2.12,<2.22): install() "
        f"refuses it unless {OPT_IN}=1 (not set)")
    assert lines[7].startswith("install check: FAILED: tfdtape: untested "
                               "TensorFlow release")
    assert lines[5].startswith("job: this process alone")  # after the resolvers
    opted_in = python(["-m", "tfdtape", "info"],
                      dict(environment, **{OPT_IN: "1"}))
    assert opted_in.stdout.splitlines()[2].endswith(f"{OPT_IN}=1 (set)")
    assert "install check: OK" in opted_in.stdout.splitlines()


def test_run_on_an_untested_release(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import tensorflow as tf\n"
                      "import tfdtape\n"
                      "print(tf.__version__, tfdtape.is_installed())\n")
    environment = posing_as(tmp_path, NIGHTLY)
    refused = python(["-m", "tfdtape", "run", "--quiet", str(script)],
                     environment)
    assert refused.returncode == 2
    assert refused.stdout == ""
    assert tfdtape_lines(refused.stderr) == [refusal_text(
        NIGHTLY, "a development build, newer than the tested range")]
    accepted = python(["-m", "tfdtape", "run", "--quiet", str(script)],
                      dict(environment, **{OPT_IN: "1"}))
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout == f"{NIGHTLY} True\n"


def test_info_with_an_unreadable_opt_in_says_so(tmp_path):
    environment = dict(posing_as(tmp_path, NIGHTLY), **{OPT_IN: "maybe"})
    completed = python(["-m", "tfdtape", "info"], environment)
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert lines[2].endswith(f"{OPT_IN}=1 (set to a value not understood)")
    assert (f"install check: FAILED: tfdtape: {OPT_IN}='maybe' is not "
            "understood: expected one of 0, 1, false, no, off, on, true, yes. "
            "Set it to 1 to install tfdtape on an untested TensorFlow release"
            ) in lines


@pytest.mark.parametrize("value", ["", "  "], ids=["empty", "blank"])
def test_an_empty_opt_in_is_unset(untested, monkeypatch, value):
    monkeypatch.setenv(OPT_IN, value)
    with pytest.raises(tfdtape.UnsupportedTensorFlowError):
        tfdtape.install()
    monkeypatch.setenv("TFDTAPE_AUTOINSTALL", value)
    from tfdtape import switches
    assert switches.read("TFDTAPE_AUTOINSTALL", True, "") is True
