"""`python -m tfdtape verify|info`: the checks, their verdicts and the reports."""

import json
import os
import subprocess
import sys
import types
import xml.etree.ElementTree as ElementTree

import pytest

import releases
from tfdtape import tape_functions
from tfdtape import testing
from tfdtape import versions
from tfdtape.__main__ import main
from tfdtape.cli import check_runner
from tfdtape.cli import checks

CHECK_NAMES = [check.name for check in checks.CHECKS]


def untested_header():
    """The lines verify starts with on this TensorFlow: two saying it is
    untested, or none on a tested release."""
    reason = versions.untested_reason(tf_version())
    if reason is None:
        return []
    return [f"TensorFlow {tf_version()}: untested ({reason})",
            f"tested: {versions.TESTED_RANGE_TEXT}; verify runs every check "
            "anyway"]


def check_lines(out):
    """verify's stdout lines from the first check on, asserting that its
    header says the release is untested exactly when it is."""
    lines = out.splitlines()
    header = untested_header()
    assert lines[:len(header)] == header
    return lines[len(header):]


def run_cli(*args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    completed = subprocess.run([sys.executable, "-m", "tfdtape", *args],
                               env=env, capture_output=True, text=True,
                               timeout=600)
    return completed.returncode, completed.stdout, completed.stderr


@pytest.mark.parametrize("check", checks.CHECKS, ids=CHECK_NAMES)
def test_every_check_passes_here(strategy, check):
    result = check_runner.run_check(check, strategy)
    assert result.status == check_runner.PASS, result.message
    assert result.observations["tfdtape_alone"] == check.expected
    if check.discriminating:
        assert result.observations["pre_seed"] != check.expected


def test_broken_resolution_fails_with_a_useful_message(strategy, monkeypatch):
    """tfdtape's tape functions watching components, as before the commit."""
    monkeypatch.setattr(tape_functions, "_resolve", lambda variable: (
        variable,))
    result = check_runner.run_check(checks.CHECKS[0], strategy)
    assert result.status == check_runner.FAIL
    assert result.observations["tfdtape_alone"] == "own component"
    assert ("tfdtape_alone: expected 'container', observed 'own component'"
            in result.message)
    line = check_runner.result_line(result, 30)
    assert line.startswith(f"{'replica_context_eager':30}  FAIL  ")
    assert line.endswith("tfdtape: expected 'container', observed 'own compon...")
    assert len(line) == 100


def test_a_check_the_control_passes_is_not_discriminating(strategy):
    always = checks.Check("always", "observes the same everywhere",
                          lambda strategy: "same", "same")
    result = check_runner.run_check(always, strategy)
    assert result.status == check_runner.NOT_DISCRIMINATING
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
    assert check_lines(out)[0].startswith("cross_replica_gradient")
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


def run_with_tensorflow_module(tmp_path, module_text, *args):
    """Runs `python -m tfdtape verify ...` with `tensorflow` shadowed by a
    module of `module_text`."""
    package = tmp_path / "tensorflow"
    package.mkdir()
    (package / "__init__.py").write_text(module_text)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=f"{tmp_path}{os.pathsep}"
               + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "tfdtape", "verify", *args],
                          env=env, capture_output=True, text=True, timeout=300)


INSTALL_ADVICE = ('Install it with `pip install "tfdtape[cpu]"` (or '
                  '`pip install "tfdtape[tensorflow]"`)')


@pytest.mark.parametrize("module_text, message", [
    ("raise ImportError('No module named tensorflow (blocked)')\n",
     "tfdtape: TensorFlow cannot be imported (ImportError: No module named "
     f"tensorflow (blocked)). {INSTALL_ADVICE}\n"),
    ("raise TypeError('Descriptors cannot be created directly.\\nmore')\n",
     "tfdtape: TensorFlow cannot be imported (TypeError: Descriptors cannot be "
     f"created directly.). {INSTALL_ADVICE}\n"),
    ("VERSION = 'none'\n",
     "tfdtape: the tensorflow package at "),
    ("__version__ = '2.11.0'\n",
     "tfdtape: TensorFlow 2.11.0 lacks an internal tfdtape uses "
     "(ModuleNotFoundError: No module named 'tensorflow.python'). Install "
     "tensorflow-cpu>=2.12,<2.22, or a tfdtape release that supports this "
     "TensorFlow\n"),
], ids=["ImportError", "protobuf TypeError", "no __version__",
        "no internals"])
def test_cli_unusable_tensorflow_exits_2(tmp_path, module_text, message):
    completed = run_with_tensorflow_module(tmp_path, module_text)
    assert completed.returncode == 2
    assert completed.stderr.startswith(message), completed.stderr
    assert len(completed.stderr.splitlines()) == 1, completed.stderr
    assert completed.stdout == ""


def test_cli_verify_default_output_fits_100_columns():
    code, out, _ = run_cli("verify")
    assert code == 0
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 100, max(lines, key=len)
    assert not any("pre_seed=" in line for line in lines)
    first = check_lines(out)[0].split()
    assert first[:2] == [CHECK_NAMES[0], "PASS"]
    assert first[3:] == ["container"]


def test_cli_verify_verbose_shows_every_configuration():
    code, out, _ = run_cli("verify", "--verbose", "--only", "replica_context_eager")
    assert code == 0
    lines = check_lines(out)
    assert lines[1:5] == ["    stock         container",
                          "    tfdtape       container",
                          "    tfdtape_alone container",
                          "    pre_seed      own component"]


def test_cli_repeated_only_runs_once():
    code, out, _ = run_cli("verify", "--only", "cross_replica_gradient",
                           "--only", "cross_replica_gradient")
    assert code == 0
    assert sum(line.startswith("cross_replica_gradient")
               for line in out.splitlines()) == 1
    assert "1/1 checks passed" in out


@pytest.mark.parametrize("option", ["--json", "--junit"])
@pytest.mark.parametrize("path, message", [
    ("", "needs a file path, found an empty one"),
    ("/nonexistent-dir/report", "/nonexistent-dir/report: cannot write there "
                                "(No such file or directory)"),
    ("/", "/: is a directory, expected a file path"),
], ids=["empty", "missing directory", "directory"])
def test_cli_bad_output_path_exits_2_before_any_check(option, path, message):
    code, out, err = run_cli("verify", option, path)
    assert code == 2
    assert out == ""
    assert err == f"tfdtape: {option} {message}\n".replace(f"{option} needs",
                                                            f"{option} needs")


def test_cli_without_a_space_after_dash_m():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    completed = subprocess.run(
        [sys.executable, "-mtfdtape", "verify", "--only", "cross_replica_watch"],
        env=env, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr
    assert check_lines(completed.stdout)[0].startswith("cross_replica_watch  PASS")


def test_cli_exit_1_when_a_check_fails():
    """A real subprocess whose tfdtape watches components, as before the commit."""
    program = ("import sys\n"
               "from tfdtape import tape_functions\n"
               "tape_functions._resolve = lambda variable: (variable,)\n"
               "from tfdtape.__main__ import main\n"
               "sys.exit(main(['verify', '--only', 'replica_context_eager']))\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TFDTAPE_AUTOINSTALL="0")
    completed = subprocess.run([sys.executable, "-c", program], env=env,
                               capture_output=True, text=True, timeout=300)
    assert completed.returncode == 1, completed.stderr
    assert check_lines(completed.stdout)[0].startswith("replica_context_eager  FAIL")
    assert "0/1 checks passed; failing: replica_context_eager" in completed.stdout


def test_cli_reexecutes_at_most_once(tmp_path):
    """A sitecustomize that starts TensorFlow's runtime fixes the device layout
    in every process: one re-exec, then one line and exit 2."""
    (tmp_path / "sitecustomize.py").write_text(
        "import os\n"
        "os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')\n"
        "import tensorflow as tf\n"
        "tf.constant(1.0) + 1.0\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=f"{tmp_path}{os.pathsep}"
               + os.environ.get("PYTHONPATH", ""))
    completed = subprocess.run(
        [sys.executable, "-m", "tfdtape", "verify", "--only", "cross_replica_watch"],
        env=env, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 2
    assert completed.stdout == ""
    lines = [line for line in completed.stderr.splitlines()
             if line.startswith("tfdtape:")]
    assert len(lines) == 1, completed.stderr
    assert lines[0] == (
        "tfdtape: cannot set up the virtual CPUs even in a fresh process "
        "(cannot split the CPU into 4 logical devices "
        "(tf.config.set_logical_device_configuration): expected 4 logical "
        f"CPUs, found 1 already configured in TensorFlow {tf_version()}): "
        "something runs TensorFlow ops at interpreter start-up (check "
        "sitecustomize, usercustomize and PYTHONSTARTUP)")


def tf_version():
    import tensorflow as tf
    return tf.__version__


def test_in_process_verify_uses_a_fresh_process_for_another_layout(capfd):
    """This process has 4 CPUs; asking for 3 re-runs in a subprocess."""
    assert main(["verify", "--replicas", "3", "--only",
                 "replica_context_eager"]) == 0
    out = capfd.readouterr().out
    assert "devices: 3 logical CPUs" in out


def test_cli_info_judges_holders_by_identity():
    code, out, _ = run_cli("info")
    assert code == 0
    assert "defun captured-input resolution: absent" in out
    assert "install check: OK" in out
    assert "installed in this process: no" in out
    assert ("tensorflow.python.eager.tape.watch_variable: TensorFlow's "
            "original") in out
    program = ("import tfdtape\n"
               "from tfdtape.cli.info_command import run\n"
               "run(None)\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    completed = subprocess.run([sys.executable, "-c", program], env=env,
                               capture_output=True, text=True, timeout=300)
    assert "installed in this process: yes" in completed.stdout
    assert ("tensorflow.python.eager.backprop.GradientTape.gradient: tfdtape's "
            "replacement") in completed.stdout
    assert "TensorFlow's original" not in completed.stdout.split(
        "patch targets")[1]


def break_resolution(monkeypatch, strategy):
    monkeypatch.setattr(tape_functions, "_resolve", lambda variable: (variable,))
    return strategy


def break_total(monkeypatch, strategy):
    """Each total becomes its first component's gradient, summed in place
    or reduced by the strategy."""
    from tfdtape import component_totals
    monkeypatch.setattr(component_totals, "sum_components",
                        lambda gradients: gradients[0])
    monkeypatch.setattr(component_totals, "reduce",
                        lambda pairs: [gradients[0] for _, gradients in pairs])
    return strategy


def break_sync_on_read_check(monkeypatch, strategy):
    from tfdtape import on_read_sources
    monkeypatch.setattr(on_read_sources, "is_on_read", lambda variable: False)
    return strategy


def break_distributed_source_detection(monkeypatch, strategy):
    from tfdtape import gradient_tape
    monkeypatch.setattr(gradient_tape, "_is_distributed_source", lambda source: False)
    return strategy


def break_replica_recording(monkeypatch, strategy):
    from tfdtape import spanning_tapes
    monkeypatch.setattr(spanning_tapes, "recording_tapes_here", lambda: [])
    return strategy


def break_no_scope_totals(monkeypatch, strategy):
    from tfdtape import gradient_tape
    monkeypatch.setattr(gradient_tape, "_outside_replica_context",
                        lambda cross_replica: cross_replica)
    return strategy


def break_merge_call(monkeypatch, strategy):
    from tfdtape import merge_calls
    monkeypatch.setattr(merge_calls, "make_maybe_merge_call",
                        lambda original: lambda fn, strategy, *args, **kwargs:
                        original(fn, strategy, *args, **kwargs))
    return strategy


def use_a_strategy_that_does_not_mirror(monkeypatch, strategy):
    import tensorflow as tf
    return tf.distribute.get_strategy()


def leave_captured_input_resolution(monkeypatch, strategy):
    """A function class that still resolves, and a tfdtape that keeps it."""

    class ResolvingFunction:
        def _resolve_captured_inputs(self):
            return []

    from tfdtape import captured_inputs
    monkeypatch.setattr(captured_inputs, "classes_with_captured_input_resolution",
                        lambda: [ResolvingFunction])
    monkeypatch.setattr(captured_inputs, "make_resolver_replacement", lambda original: original)
    return strategy


def break_uninstall(monkeypatch, strategy):
    """install() records copies as the originals, so uninstall() restores
    copies. monkeypatch.undo() puts back the real state afterwards."""
    from tfdtape import targets
    for target in targets.patch_targets():
        monkeypatch.setattr(target.owner, target.attribute, target.current())
    real_check = targets.PatchTarget.check

    def check_and_copy(self):
        original = real_check(self)
        # Same code and globals: still TensorFlow's own, but another object.
        return types.FunctionType(original.__code__, original.__globals__,
                                  original.__name__, original.__defaults__,
                                  original.__closure__)

    monkeypatch.setattr(targets.PatchTarget, "check", check_and_copy)
    return strategy


_ERROR, _MESSAGE = releases.unresolved_container_error("watch_variable")
UNRESOLVED_WATCH = f"'raised {_ERROR.__name__}" + (
    f": {_MESSAGE}" if _ERROR is ValueError else "")
"""How the resolution-less watch of a container fails on this release."""

BREAKERS = {
    "replica_context_eager": (break_resolution, "'own component'"),
    "replica_context_tf_function": (break_resolution, "'own component'"),
    "watched_variables_reset": (break_resolution, "'own component'"),
    "captured_variable_tf_function": (break_resolution,
                                      "'own component read, own component'"),
    "cross_replica_tape_call": (break_resolution, UNRESOLVED_WATCH),
    "cross_replica_watch": (break_resolution, UNRESOLVED_WATCH),
    "cross_replica_gradient": (break_total, "'gradient 1'"),
    "sync_on_read_gradient_error": (break_sync_on_read_check, "'no error'"),
    "keras_cross_replica_gradient": (
        break_distributed_source_detection,
        "'raised ValueError: DistributedVariable.handle is not available"),
    "tape_around_strategy_run": (break_replica_recording, "'gradient None'"),
    "tape_around_strategy_run_no_scope": (break_no_scope_totals,
                                          "'gradient 6'"),
    "apply_gradients_cross_replica": (
        break_merge_call,
        "\"raised AttributeError: 'NoneType' object has no attribute "
        "'merge_call'\""),
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
    result = check_runner.run_check(check, broken_strategy)
    monkeypatch.undo()
    assert result.status == check_runner.FAIL
    assert result.message.startswith(
        f"tfdtape: expected {check.expected!r}, observed {observed}")
