"""The `run` report as users read it, on programs shaped like theirs: one row
per variable, short when healthy, warnings for the classic bugs, tracebacks
without tfdtape's frames, locations relative to where the run started, and
a status line that states the run's own exit status."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import tensorflow as tf

from run_helpers import SCRIPTS
from run_helpers import script_line
from run_helpers import summary_of
from run_helpers import tfdtape_run

KERAS_3 = hasattr(tf.keras, "Variable") and not issubclass(tf.keras.Variable,
                                                           tf.Variable)


def plain_python(*arguments, cwd=None):
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    environment.pop("TF_CONFIG", None)
    return subprocess.run([sys.executable, *arguments], capture_output=True,
                          text=True, cwd=cwd, env=environment, timeout=300)


@pytest.mark.skipif(not KERAS_3, reason="Keras 3 (tf.keras from TensorFlow 2.16)")
def test_a_keras_subclassed_model_has_a_row_per_variable_named_by_its_path(
        tmp_path):
    report_path = tmp_path / "report.json"
    completed = tfdtape_run("--json", str(report_path), "--verbose",
                            str(SCRIPTS / "keras_subclassed.py"))
    assert completed.returncode == 0, completed.stderr
    paths = completed.stdout.split("paths: ")[1].split()
    report = json.loads(report_path.read_text())
    assert report["schema"] == "tfdtape-run/2"
    assert sorted(v["name"] for v in report["variables"]) == sorted(paths)
    assert {w["variable"] for w in report["watched"]} == set(paths)
    unused = {n["source"] for n in report["none_gradients"]}
    assert unused == {path for path in paths if "/dense_2/" in path}
    summary = summary_of(completed.stderr)
    rows = [line.split() for line in summary.splitlines()
            if re.match(r"  \d+ +two_layers/", line)]
    assert sorted(row[1] for row in rows) == sorted(paths)
    for path in unused:
        assert f"  {path}: not connected to the target (replica)" in summary


def test_a_healthy_run_of_160_variables_fits_a_screen(tmp_path):
    completed = tfdtape_run(str(SCRIPTS / "big_model.py"))
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout == "variables: 160\n"
    summary = summary_of(completed.stderr).splitlines()
    assert len(summary) <= 25, "\n".join(summary)
    assert re.fullmatch(r"  replica 0,1 +container +160 +320 +0", summary[5]), summary
    assert "Warnings" not in "\n".join(summary)
    verbose = summary_of(tfdtape_run("--verbose", str(SCRIPTS / "big_model.py"))
                         .stderr).splitlines()
    assert len([line for line in verbose if re.match(r"  \d+ ", line)]) == 160


def test_the_classic_bugs_are_warned_about(tmp_path):
    script = shutil.copy(SCRIPTS / "classic_bugs.py", tmp_path)
    completed = tfdtape_run("--json", str(tmp_path / "r.json"), "classic_bugs.py",
                            cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout == "caught: NotWatchableError\n"
    report = json.loads((tmp_path / "r.json").read_text())
    located = [(w["kind"], w["location"], w["count"]) for w in report["warnings"]]
    assert located == [
        ("plain variable in replica context",
         f"{script}:{script_line('classic_bugs.py', '# READ')}", 4),
        ("cross-replica gradient on one device",
         f"{script}:{script_line('classic_bugs.py', '# ONE DEVICE')}", 1),
        ("refused by tfdtape",
         f"{script}:{script_line('classic_bugs.py', '# REFUSED')}", 1)]
    assert report["warnings"][2]["message"].startswith(
        "tfdtape: cannot watch a non-tensor (tf.GradientTape.watch)")
    summary = summary_of(completed.stderr)
    assert "Warnings: 3" in summary.splitlines()
    assert (f"    outside:0: used 4 times, first at classic_bugs.py:"
            f"{script_line('classic_bugs.py', '# READ')}") in summary
    assert "Create it inside strategy.scope()" in summary
    failing = tfdtape_run("--fail-on-warning", "--quiet", "classic_bugs.py",
                          cwd=tmp_path)
    assert failing.returncode == 1


def test_the_status_line_says_why_the_run_exits_otherwise(tmp_path):
    completed = tfdtape_run("--fail-on-none-gradient",
                            str(SCRIPTS / "none_causes.py"), cwd=tmp_path)
    assert completed.returncode == 1
    lines = summary_of(completed.stderr).splitlines()
    assert lines[0].endswith(" exited with status 0")
    assert re.fullmatch(r"tfdtape run exits with status 1: "
                        r"--fail-on-none-gradient, and \d+ None gradients",
                        lines[1])


@pytest.mark.parametrize("how", ["../x.py", "absolute", "-m"])
def test_locations_are_relative_to_where_the_run_started(tmp_path, how):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "x.py").write_text(
        "import tensorflow as tf\n"
        "v = tf.Variable(1.0)\n"
        "with tf.GradientTape() as tape:\n"
        "    pass\n"
        "tape.gradient(tf.constant(1.0), v)\n")
    start = tmp_path / "start"
    start.mkdir()
    if how == "../x.py":
        start, target = package / "sub", ["../x.py"]
        start.mkdir()
        shown = "../x.py:5"
    elif how == "absolute":
        target, shown = [str(package / "x.py")], "../pkg/x.py:5"
    else:
        target, shown = ["-m", "pkg.x"], "../pkg/x.py:5"
    environment = None if how != "-m" else {  # Bazel finds tfdtape there too
        "PYTHONPATH": os.pathsep.join(filter(None, [
            str(tmp_path), os.environ.get("PYTHONPATH")]))}
    completed = tfdtape_run(*target, cwd=start, env=environment)
    assert completed.returncode == 0, completed.stderr
    assert f", once at {shown}\n" in summary_of(completed.stderr)
    assert str(tmp_path) not in summary_of(completed.stderr)


def traceback_before_summary(stderr):
    end = stderr.index("tfdtape run: ") if "tfdtape run: " in stderr else None
    return stderr[stderr.index("Traceback"):end]


def defined_at_frames(text):
    """The frames of the first "defined at" stack in `text` (AutoGraph's
    generated files named alike)."""
    lines = text[text.index("defined at"):].splitlines()[1:]
    frames = []
    for line in lines:  # indented frame and source lines, blank lines
        if line.strip() and not line[0].isspace():
            break
        frames += re.findall(r'File "([^"]+)", line (\d+), in (\S+)', re.sub(
            r"__autograph_generated_file\w+", "<generated>", line))
    assert frames
    return frames


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_a_raise_inside_a_replica_function_shows_no_tfdtape_frames(mode):
    script = str(SCRIPTS / "replica_raise.py")
    completed = tfdtape_run(script, mode)
    assert completed.returncode == 1
    shown = traceback_before_summary(completed.stderr)
    assert "loss is not 2" in shown
    for hidden in ("/tfdtape/", "runpy", "<frozen"):
        assert hidden not in shown, shown
    stock = plain_python(script, mode)
    assert stock.returncode == 1
    # tfdtape's call_for_each_replica goes through TensorFlow's filter.
    assert f'File "{script}", line' in shown
    if mode == "function":  # the "defined at" stack: the frames stock shows
        assert defined_at_frames(shown) == defined_at_frames(
            traceback_before_summary(stock.stderr))


def test_tfdtapes_refusal_in_a_plain_program_ends_at_the_users_call(tmp_path):
    script = tmp_path / "refused.py"
    script.write_text("import tfdtape\n"
                      "import tensorflow as tf\n"
                      "with tf.GradientTape() as tape:\n"
                      "    tape.watch('a string')\n")
    completed = plain_python(str(script))
    assert completed.returncode == 1
    shown = completed.stderr[completed.stderr.index("Traceback"):]
    files = re.findall(r'File "([^"]+)"', shown)
    # The script's line, TensorFlow's re-raising frame, and (as TensorFlow's
    # own errors keep theirs) the innermost frame, where the error was raised.
    assert files[0] == str(script)
    assert files[1].endswith("tensorflow/python/util/traceback_utils.py")
    assert len(files) == 3, shown
    assert shown.rstrip().splitlines()[-1].startswith(
        "tfdtape.errors.NotWatchableError: tfdtape: cannot watch a non-tensor")


def test_a_watch_inside_a_tf_function_runs_tfdtapes_code_unconverted(tmp_path):
    script = tmp_path / "watch_none.py"
    script.write_text("import tfdtape\n"
                      "import tensorflow as tf\n"
                      "@tf.function\n"
                      "def step():\n"
                      "    with tf.GradientTape() as tape:\n"
                      "        tape.watch(None)\n"
                      "step()\n")
    completed = plain_python(str(script))
    assert completed.returncode == 1
    assert "NotWatchableError: tfdtape: " in completed.stderr
    # AutoGraph's converted copies of tfdtape's functions would show here.
    assert "tf__watch" not in completed.stderr
    assert "tf___watchables" not in completed.stderr
    assert f'File "{script}", line 6, in step' in completed.stderr


def test_both_fail_options_are_named_when_both_apply(tmp_path):
    script = tmp_path / "both.py"
    script.write_text("import tensorflow as tf\n"
                      "import tfdtape\n"
                      "v = tf.Variable(1.0)\n"
                      "with tf.GradientTape() as tape:\n"
                      "    pass\n"
                      "tape.gradient(tf.constant(1.0), v)\n"
                      "try:\n"
                      "    tfdtape.resolve(None)\n"
                      "except tfdtape.NotWatchableError:\n"
                      "    pass\n")
    completed = tfdtape_run("--fail-on-none-gradient", "--fail-on-warning",
                            str(script), cwd=tmp_path)
    assert completed.returncode == 1
    lines = summary_of(completed.stderr).splitlines()
    assert " ".join(lines[1:3]) == (  # wrapped within 100 columns
        "tfdtape run exits with status 1: --fail-on-none-gradient, and 1 None "
        "gradient; --fail-on-warning, and 1 warning")
    assert lines[3].startswith("TensorFlow ")


def test_a_tape_around_strategy_run_is_counted_with_its_totals(tmp_path):
    report_path = tmp_path / "report.json"
    completed = tfdtape_run("--json", str(report_path),
                            str(SCRIPTS / "spanning_step.py"))
    assert completed.returncode == 0, completed.stderr
    # Each step: d loss / d kernel = [3, 3] (the replicas' features 1 and 2).
    assert completed.stdout == (
        "kernel [0.1, 0.1] replicas identical True\n")
    summary = summary_of(completed.stderr)
    line = next(n for n in summary.splitlines() if n.startswith("Gradients:"))
    assert line == ("Gradients: 3 tape.gradient calls; None: 0; total "
                    "derivatives: 6; from tapes around strategy.run: 3")
    assert "None gradient" not in summary and "Warnings" not in summary
    # A long (absolute) path wraps the line: compare with the wrapping undone.
    assert re.search(r" at \S*spanning_step\.py:26: 2 variables, each the sum "
                     r"of 2 components, 6 in all ", " ".join(summary.split()) + " "
                     ), summary
    report = json.loads(report_path.read_text())
    assert report["gradient_calls_around_runs"] == 3
    assert report["none_gradients"] == []


def test_the_same_step_fails_on_stock_tensorflow():
    completed = tfdtape_run("--no-install", str(SCRIPTS / "spanning_step.py"))
    assert completed.returncode == 1
    assert completed.stdout == ""
    assert "DistributedVariable.handle is not available" in completed.stderr
