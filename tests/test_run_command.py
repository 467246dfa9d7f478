"""`python -m tfdtape run`: real scripts in subprocesses, run as `python
SCRIPT` would run them, with the tapes' story told at exit."""

import importlib.metadata
import json
import os
import py_compile
import re
import subprocess
import sys
import zipfile

import pytest

from run_helpers import SCRIPTS
from run_helpers import summary_of
from run_helpers import tfdtape_run
from tfdtape import explaining
from tfdtape.cli import run_report
from tfdtape.cli import run_session


def test_a_correct_training_script(tmp_path):
    script = SCRIPTS / "mirrored_training.py"
    report_path = tmp_path / "report.json"
    completed = tfdtape_run("--json", str(report_path), str(script), "0", "--lr",
                            stdin="hello from stdin\n")
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert lines == [
        "stdin: hello from stdin",
        f"argv: [{str(script)!r}, '0', '--lr']",
        f"path0: {SCRIPTS}",
        f"file: {script}",
        "name: __main__"]
    summary = summary_of(completed.stderr)
    assert max(len(line) for line in summary.splitlines()) <= 100
    assert "; None: 0; total derivatives: 0" in summary
    report = json.loads(report_path.read_text())
    assert report["schema"] == run_report.SCHEMA == "tfdtape-run/2"
    assert report["exit_status"] == 0 and report["installed"] is True
    assert report["command"] == [str(script), "0", "--lr"]
    assert report["none_gradients"] == [] and report["total_derivatives"] == []
    reads = {(w["variable"], w["how"], w["context"], w["replica"]): w["count"]
             for w in report["watched"] if w["kind"] == "access"}
    # 3 steps, each replica reads kernel and bias once per step.
    assert reads == {(name, "container", "replica", replica): 3
                     for name in ("kernel:0", "bias:0") for replica in (0, 1)}
    assert re.search(r"\n  replica 0,1 +container +2 +12 +0\n", summary)
    assert [(v["name"], v["type"]) for v in report["variables"]] == [
        ("kernel:0", "MirroredVariable"), ("bias:0", "MirroredVariable")]


def cause_lines():
    """CAUSE reason -> line number, from none_causes.py's markers."""
    found = {}
    lines = (SCRIPTS / "none_causes.py").read_text().splitlines()
    for number, line in enumerate(lines, start=1):
        if "# CAUSE: " in line:
            found[line.split("# CAUSE: ")[1]] = number
    return found


def test_each_none_cause_is_reported_with_its_line(tmp_path):
    script = SCRIPTS / "none_causes.py"
    report_path = tmp_path / "report.json"
    completed = tfdtape_run("--json", str(report_path), str(script))
    assert completed.returncode == 0, completed.stderr
    report = json.loads(report_path.read_text())
    found = {}
    for item in report["none_gradients"]:
        key = (item["reason"], item["location"])
        found[key] = found.get(key, 0) + item["count"]
    expected_lines = cause_lines()
    assert sorted(expected_lines) == sorted(explaining.REASONS)
    # Every cause once, but "watched as the container": once per replica.
    assert found == {
        (reason, f"{script}:{line}"):
            2 if reason == explaining.WATCHED_CONTAINER else 1
        for reason, line in expected_lines.items()}
    summary = summary_of(completed.stderr)
    assert max(len(line) for line in summary.splitlines()) <= 100
    relative = os.path.relpath(script)  # as the summary shows paths:
    if relative.split(os.sep)[:4] == [os.pardir] * 4:  # absolute if far up
        relative = str(script)
    flat = " ".join(summary.split())  # a long line wraps
    for reason, line in expected_lines.items():
        assert re.search(rf": {reason} \([a-z -]+\), (once|\d+ times) at "
                         rf"{re.escape(relative)}:{line}\b", flat), reason
        assert flat.count(f"why {reason}: ") == 1


def test_a_script_that_raises(tmp_path):
    completed = tfdtape_run(str(SCRIPTS / "raises.py"))
    assert completed.returncode == 1
    stderr = completed.stderr
    assert stderr.index("Traceback (most recent call last):") < stderr.index(
        "tfdtape run: ")
    traceback_text = stderr[stderr.index("Traceback"):stderr.index("tfdtape run: ")]
    assert f'File "{SCRIPTS / "raises.py"}", line 15, in <module>' in traceback_text
    assert "RuntimeError: the training diverged" in traceback_text
    assert "tfdtape/cli/run_command.py" not in traceback_text
    assert "exited with status 1" in summary_of(stderr)


def test_sys_exit_status_is_kept():
    completed = tfdtape_run(str(SCRIPTS / "mirrored_training.py"), "3")
    assert completed.returncode == 3
    assert "exited with status 3" in summary_of(completed.stderr)


def test_run_a_module_with_dash_m():
    completed = tfdtape_run("-m", "pkg.train_module", "x", cwd=SCRIPTS)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.splitlines() == [
        "gradient: 4.0",
        f"argv: [{str(SCRIPTS / 'pkg' / 'train_module.py')!r}, 'x']",
        "name: __main__"]
    assert "tfdtape run: -m pkg.train_module x exited with status 0" in (
        completed.stderr)


def test_fail_on_none_gradient_and_quiet(tmp_path):
    report_path = tmp_path / "report.json"
    completed = tfdtape_run("--fail-on-none-gradient", "--quiet", "--json",
                            str(report_path), str(SCRIPTS / "none_causes.py"))
    assert completed.returncode == 1
    assert "tfdtape run:" not in completed.stderr
    assert json.loads(report_path.read_text())["exit_status"] == 0
    clean = tfdtape_run("--fail-on-none-gradient", "--quiet",
                        str(SCRIPTS / "mirrored_training.py"))
    assert clean.returncode == 0 and "tfdtape run:" not in clean.stderr


def test_no_install_records_stock_tensorflow(tmp_path):
    script = str(SCRIPTS / "cross_replica_gradient.py")
    with_tfdtape = tfdtape_run("--json", str(tmp_path / "on.json"), script)
    assert with_tfdtape.returncode == 0, with_tfdtape.stderr
    assert with_tfdtape.stdout == "gradient: 3.0\n"
    on = json.loads((tmp_path / "on.json").read_text())
    assert [(t["source"], t["components"]) for t in on["total_derivatives"]] == [
        ("v:0", 2)]
    stock = tfdtape_run("--no-install", "--json", str(tmp_path / "off.json"),
                        script)
    assert stock.returncode == 1
    assert ("ValueError: DistributedVariable.handle is not available outside "
            "the replica context") in stock.stderr
    off = json.loads((tmp_path / "off.json").read_text())
    assert off["installed"] is False and off["total_derivatives"] == []
    assert "not installed (stock TensorFlow observed)" in summary_of(stock.stderr)


@pytest.mark.parametrize("arguments, message", [
    (["--frobnicate", "x.py"], "tfdtape: run: unknown option --frobnicate"),
    ([], "tfdtape: run: no script given"),
    (["missing_script.py"], "tfdtape: run: cannot run missing_script.py: no "
                            "such file"),
    (["-m", "no_such_module_anywhere"], "tfdtape: run: no module named "
                                         "'no_such_module_anywhere'"),
    (["--json"], "tfdtape: --json needs a path"),
    (["--json", "/nonexistent-dir/r.json", "SCRIPT"],
     "tfdtape: --json /nonexistent-dir/r.json: cannot write there"),
], ids=["unknown option", "no script", "missing script", "missing module",
        "json without path", "unwritable json"])
def test_bad_arguments_exit_2_and_the_script_never_runs(tmp_path, arguments,
                                                        message):
    marker = tmp_path / "ran"
    script = tmp_path / "script.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    arguments = [str(script) if a == "SCRIPT" else a for a in arguments]
    completed = tfdtape_run(*arguments)
    assert completed.returncode == 2
    assert completed.stderr.startswith(message), completed.stderr
    assert len(completed.stderr.splitlines()) == 1
    assert not marker.exists()


def test_the_json_report_lands_where_asked_even_if_the_script_changes_directory(
        tmp_path):
    script = tmp_path / "wanders.py"
    script.write_text("import os\nos.chdir('/')\n")
    completed = tfdtape_run("--quiet", "--json", "report.json", str(script),
                            cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert json.loads((tmp_path / "report.json").read_text())["exit_status"] == 0


def test_another_librarys_patch_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(
        "import functools\n"
        "from tensorflow.python.eager import tape\n"
        "original = tape.variable_accessed\n"
        "@functools.wraps(original)\n"
        "def counting(variable):\n"
        "    return original(variable)\n"
        "tape.variable_accessed = counting\n")
    marker = tmp_path / "ran"
    script = tmp_path / "script.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    completed = tfdtape_run(str(script), env={
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert completed.returncode == 2
    lines = [line for line in completed.stderr.splitlines()
             if line.startswith("tfdtape:")]
    assert len(lines) == 1 and lines[0].startswith("tfdtape: cannot install")
    assert "sitecustomize.counting" in lines[0]
    assert not marker.exists()


@pytest.mark.parametrize("body, status, stdout", [
    ("import os\nos.chdir('/')\nprint(__file__)\n", 0, "{script}\n"),
    ("import sys\ndef hook(kind, value, trace):\n    print('hook', kind.__name__)\n"
     "sys.excepthook = hook\nraise ValueError('x')\n", 1, "hook ValueError\n"),
    ("import sys\nsys.exit(-1)\n", 255, ""),
    ("import sys\nsys.exit(True)\n", 1, ""),
    ("import threading, time\n"
     "def late():\n    time.sleep(0.5)\n    print('thread done', flush=True)\n"
     "threading.Thread(target=late).start()\n", 0, "thread done\n"),
    ("print(__annotations__)\n", 0, "{{}}\n"),
    ("import sys\nsys.exit(2 ** 100)\n", 255, ""),
    ("from concurrent.futures import ThreadPoolExecutor\n"
     "pool = ThreadPoolExecutor(max_workers=2)\n"
     "print(pool.submit(pow, 2, 10).result())\n", 0, "1024\n"),
    ("import sys\nsys.stdout = None\n", 0, ""),
    ("import sys\nsys.stderr = None\n", 0, ""),
    ("import sys\nsys.stderr.close()\n", 0, ""),
    ("import os, tempfile\nos.chdir(tempfile.mkdtemp())\nos.rmdir(os.getcwd())\n",
     0, ""),
    ("import sys\n"
     "class AskEveryone:\n"
     "    def find_spec(self, name, path=None, target=None):\n"
     "        for finder in sys.meta_path:\n"
     "            if finder is not self and hasattr(finder, 'find_spec'):\n"
     "                spec = finder.find_spec(name, path, target)\n"
     "                if spec is not None:\n"
     "                    return spec\n"
     "sys.meta_path.insert(0, AskEveryone())\n"
     "import tensorflow as tf\n"
     "from tensorflow.python.eager import tape\n"
     "print(tape.watch_variable.__module__.split('.')[0] in ('tensorflow', "
     "'tfdtape'))\n", 0, "True\n"),
    ("import sys\ndef hook(kind, value, trace):\n    raise OSError('hook broke')\n"
     "sys.excepthook = hook\nraise ValueError('x')\n", 1, ""),
    ("import sys\ndef hook(kind, value, trace):\n    sys.exit(5)\n"
     "sys.excepthook = hook\nraise ValueError('x')\n", 5, ""),
    ("import os, sys\nsys.stderr = open(os.devnull, 'wb')\n", 0, ""),
    ("import logging\nlogging.basicConfig(level=logging.INFO)\n"
     "import tensorflow\n", 0, ""),
    ("import os, signal, threading, time\n"
     "threading.Thread(target=time.sleep, args=(5,)).start()\n"
     "threading.Timer(1, os.kill, (os.getpid(), signal.SIGINT)).start()\n",
     0, ""),
], ids=["__file__ absolute", "excepthook", "exit -1", "exit True",
        "non-daemon thread", "__annotations__", "exit beyond a C long",
        "thread pool left open", "stdout None", "stderr None",
        "stderr closed", "working directory removed",
        "a finder that asks every finder", "excepthook fails",
        "excepthook exits", "binary stderr", "logging at INFO",
        "Ctrl-C while Python waits for threads at exit"])
def test_the_script_runs_as_under_python(tmp_path, body, status, stdout):
    script = tmp_path / "script.py"
    script.write_text(body)
    stderrs = []
    for runner in ([sys.executable], [sys.executable, "-m", "tfdtape", "run",
                                      "--quiet", "--json", "report.json"]):
        completed = subprocess.run(
            runner + ["script.py"], cwd=tmp_path, capture_output=True,
            text=True, timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        assert completed.returncode == status, (runner, completed.stderr)
        assert completed.stdout == stdout.format(script=script), runner
        stderrs.append([line for line in completed.stderr.splitlines()
                        if not re.match(r"[IWE]\d{4} |WARNING: All log", line)])
    assert stderrs[0] == stderrs[1]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["exit_status"] == status


def test_keyboard_interrupt_ends_the_process_by_sigint(tmp_path):
    """After atexit handlers and finalization (open files flushed), as
    Python ends on an uncaught KeyboardInterrupt."""
    script = tmp_path / "interrupted.py"
    script.write_text("import atexit\n"
                      "atexit.register(print, 'atexit ran', flush=True)\n"
                      "unflushed = open('unflushed.txt', 'w')\n"
                      "unflushed.write('kept')\n"
                      "raise KeyboardInterrupt\n")
    plain = subprocess.run([sys.executable, str(script)], capture_output=True,
                           text=True, timeout=120, cwd=tmp_path)
    assert (tmp_path / "unflushed.txt").read_text() == "kept"
    (tmp_path / "unflushed.txt").unlink()
    completed = tfdtape_run(str(script), cwd=tmp_path)
    assert completed.returncode == plain.returncode == -2
    assert completed.stdout == plain.stdout == "atexit ran\n"
    assert (tmp_path / "unflushed.txt").read_text() == "kept"
    assert completed.stderr.startswith(plain.stderr)  # the traceback, once
    assert "exited with status 1" in summary_of(completed.stderr)


@pytest.mark.parametrize("script_status, run_status", [(0, 2), (3, 3)])
def test_a_report_that_cannot_be_written_at_the_end_is_one_line(
        tmp_path, script_status, run_status):
    (tmp_path / "work").mkdir()
    script = tmp_path / "removes_its_folder.py"
    script.write_text(f"import os, sys\nos.rmdir({str(tmp_path / 'work')!r})\n"
                      f"sys.exit({script_status})\n")
    completed = tfdtape_run("--quiet", "--json", "r.json", str(script),
                            cwd=tmp_path / "work")
    assert completed.returncode == run_status
    assert completed.stderr == (
        f"tfdtape: --json {tmp_path / 'work' / 'r.json'}: cannot write the "
        "report (No such file or directory)\n")


def test_pytest_under_run_with_tests_that_use_tfdtape(tmp_path):
    (tmp_path / "test_uses_tfdtape.py").write_text(
        "import tfdtape\n"
        "INSTALLED_ON_IMPORT = tfdtape.is_installed()  # imports tfdtape.patching\n"
        "def test_installed(tfdtape_installed):\n"
        "    assert INSTALLED_ON_IMPORT and tfdtape.is_installed()\n")
    # -p loads the plugin by name where tfdtape is not pip-installed (Bazel);
    # pip-installed, its entry point also marks tfdtape for assertion rewriting.
    completed = tfdtape_run("--quiet", "--json", "r.json", "-m", "pytest", "-q",
                            "-p", "no:cacheprovider", "-p", "tfdtape_pytest",
                            "test_uses_tfdtape.py", cwd=tmp_path)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "1 passed" in completed.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["complete"] is True and report["tensorflow"] == tf_version()


@pytest.mark.parametrize("form", ["/dev/stdin", "compiled.pyc", "- closed"])
def test_scripts_python_runs_from_a_pipe_or_compiled(tmp_path, form):
    (tmp_path / "facts.py").write_text(
        "import sys\nprint(__file__, sys.argv, sys.path[0])\n")
    py_compile.compile(str(tmp_path / "facts.py"),
                       cfile=str(tmp_path / "compiled.pyc"))
    outputs = []
    for runner in ([sys.executable], [sys.executable, "-m", "tfdtape", "run",
                                      "--quiet"]):
        if form == "- closed":
            completed = subprocess.run(runner + ["-"], stdin=subprocess.DEVNULL,
                                       close_fds=True, cwd=tmp_path,
                                       capture_output=True, text=True,
                                       timeout=120, preexec_fn=lambda: os.close(0))
        else:
            completed = subprocess.run(
                runner + [form], input=(tmp_path / "facts.py").read_text(),
                cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert completed.returncode == 0, completed.stderr
        outputs.append(completed.stdout)
    assert outputs[0] == outputs[1]


def test_help_exits_0():
    completed = tfdtape_run("--help")
    assert completed.returncode == 0
    assert completed.stdout.startswith("usage: python -m tfdtape run")
    assert "--fail-on-none-gradient" in completed.stdout


def test_tensorflow_arrives_with_the_scripts_own_import(tmp_path):
    script = tmp_path / "late.py"
    script.write_text(
        "import sys\n"
        "print('tensorflow' in sys.modules)\n"
        "import tensorflow\n"
        "from tensorflow.python.eager import tape\n"
        "print(tape.watch_variable.__module__)\n")
    expected = {"python": "tensorflow.python.eager.tape",
                "run": "tfdtape.tape_functions",
                "run --no-install": "tensorflow.python.eager.tape"}
    for name, runner in [("python", [sys.executable]),
                         ("run", [sys.executable, "-m", "tfdtape", "run"]),
                         ("run --no-install", [sys.executable, "-m", "tfdtape",
                                               "run", "--no-install"])]:
        completed = subprocess.run(
            runner + [str(script)], capture_output=True, text=True, timeout=300,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        assert completed.returncode == 0, (name, completed.stderr)
        assert completed.stdout == f"False\n{expected[name]}\n", name


@pytest.mark.parametrize("first_import", [
    "import tfdtape\nwith tfdtape.trace() as trace:\n    import tensorflow as tf\n",
    "from tfdtape import testing\nimport tensorflow as tf\n",
    "import keras\nimport tensorflow as tf\n",
    "import threading\nthreads = [threading.Thread(target=__import__, "
    "args=('tensorflow',)) for _ in range(3)]\n"
    "[thread.start() for thread in threads]\n"
    "[thread.join() for thread in threads]\nimport tensorflow as tf\n",
], ids=["inside tfdtape.trace", "through tfdtape.testing", "through keras",
        "from threads"])
def test_tfdtape_is_in_however_tensorflow_arrives(tmp_path, first_import):
    script = tmp_path / "arrives.py"
    script.write_text(
        first_import +
        "strategy = tf.distribute.MirroredStrategy(['/cpu:0'])\n"
        "with strategy.scope():\n"
        "    v = tf.Variable(2.0, name='v')\n"
        "    with tf.GradientTape() as tape:\n"
        "        y = v * v\n"
        "    print(tape.gradient(y, v).numpy())\n"
        "from tensorflow.python.eager import tape as tape_module\n"
        "print(tape_module.watch_variable.__module__)\n")
    completed = tfdtape_run("--json", str(tmp_path / "report.json"), str(script))
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout == "4.0\ntfdtape.tape_functions\n"
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["tensorflow"] == tf_version() and report["complete"] is True
    assert [(t["source"], t["components"]) for t in report["total_derivatives"]] == [
        ("v:0", 1)]


def tf_version():
    """The installed TensorFlow's version, read in a subprocess."""
    return subprocess.run(
        [sys.executable, "-c", "import tensorflow; print(tensorflow.__version__)"],
        capture_output=True, text=True, check=True, timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")).stdout.strip()


def test_a_script_that_never_imports_tensorflow(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text("print('no tensorflow here')\n")
    completed = tfdtape_run("--json", str(tmp_path / "report.json"), str(script))
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout == "no tensorflow here\n"
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["tensorflow"] is None and report["complete"] is True
    assert report["watched"] == report["none_gradients"] == []
    assert report["incomplete_reason"] is None
    assert ("the script did not import TensorFlow, so there was nothing to "
            "record") in summary_of(completed.stderr)


def fake_tensorflow(tmp_path, module_text):
    """A PYTHONPATH entry whose `tensorflow` package is `module_text`."""
    package = tmp_path / "fake" / "tensorflow"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(module_text)
    return {"PYTHONPATH": str(tmp_path / "fake")}


@pytest.mark.parametrize("body, stdout", [
    ("print('before', flush=True)\n"
     "try:\n    import tensorflow\n"
     "except Exception:\n    print('carried on')\n"
     "print('after')\n", "before\n"),
    ("import threading\n"
     "thread = threading.Thread(target=__import__, args=('tensorflow',))\n"
     "thread.start()\nthread.join()\n"
     "print('carried on')\n", ""),
], ids=["in the main thread", "in another thread"])
def test_an_untested_tensorflow_stops_the_run_at_its_import(tmp_path, body,
                                                               stdout):
    script = tmp_path / "script.py"
    script.write_text(body)
    environment = dict(fake_tensorflow(tmp_path, "__version__ = '2.11.0'\n"),
                       TFDTAPE_ALLOW_UNTESTED_TENSORFLOW="0")
    completed = tfdtape_run("--json", str(tmp_path / "r.json"), str(script),
                            env=environment)
    assert completed.returncode == 2
    assert completed.stdout == stdout
    assert completed.stderr == (
        "tfdtape: untested TensorFlow release (tensorflow.__version__): "
        "expected final releases >=2.12,<2.22, found 2.11.0 (older than the "
        "tested range) in TensorFlow 2.11.0. Install tensorflow-cpu>=2.12,"
        "<2.22 (or tensorflow), or set TFDTAPE_ALLOW_UNTESTED_TENSORFLOW=1 to "
        "install on this release anyway (tfdtape still checks every function "
        "it patches first; `python -m tfdtape verify` tells whether the patch "
        "holds there).\n")
    assert not (tmp_path / "r.json").exists()


def test_a_tensorflow_that_fails_to_import_fails_as_under_python(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("try:\n    import tensorflow\n"
                      "except ImportError as error:\n    print(error)\n")
    environment = fake_tensorflow(tmp_path, "raise ImportError('broken build')\n")
    plain = subprocess.run([sys.executable, str(script)], capture_output=True,
                           text=True, timeout=300,
                           env=dict(os.environ, **environment))
    completed = tfdtape_run("--json", str(tmp_path / "r.json"), str(script),
                            env=environment)
    assert completed.returncode == plain.returncode == 0, completed.stderr
    assert completed.stdout == plain.stdout == "broken build\n"
    assert json.loads((tmp_path / "r.json").read_text())["tensorflow"] is None


def test_no_tensorflow_at_all_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'tensorflow':\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Hide())\n")
    marker = tmp_path / "ran"
    script = tmp_path / "script.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    completed = tfdtape_run(str(script), env={"PYTHONPATH": str(tmp_path)})
    assert completed.returncode == 2
    assert completed.stderr.startswith("tfdtape: TensorFlow is not installed. ")
    assert len(completed.stderr.splitlines()) == 1
    assert not marker.exists()


def test_a_tensorflow_import_run_did_not_see_is_reported_not_hidden(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(
        "import sys\n"
        "sys.meta_path[:] = [finder for finder in sys.meta_path\n"
        "                    if type(finder).__name__ != 'AfterImport']\n"
        "import tensorflow\n")
    completed = tfdtape_run("--json", str(tmp_path / "r.json"), str(script))
    assert completed.returncode == 0, completed.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["complete"] is False and report["tensorflow"] == tf_version()
    assert report["incomplete_reason"] == run_session.UNSEEN_IMPORT_NOTE
    assert " ".join(summary_of(completed.stderr).split()).count(
        "tfdtape was not installed and nothing was recorded") == 1


MAIN_FACTS = (
    "import sys\n"
    "print(type(__loader__).__name__, getattr(__loader__, 'path', None),\n"
    "      type(__spec__.loader).__name__ if __spec__ else None, __spec__ and\n"
    "      __spec__.origin, sys.argv, sys.path[0], __file__, __package__,\n"
    "      __annotations__, sorted(globals()))\n")


@pytest.mark.parametrize("form", ["./facts.py", "app", "app.zip", "-",
                                  "-m facts"])
def test_every_form_of_script_runs_as_under_python(tmp_path, form):
    (tmp_path / "facts.py").write_text(MAIN_FACTS)
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__main__.py").write_text(MAIN_FACTS)
    with zipfile.ZipFile(tmp_path / "app.zip", "w") as archive:
        archive.writestr("__main__.py", MAIN_FACTS)
    stdin = MAIN_FACTS if form == "-" else ""
    plain = subprocess.run([sys.executable, *form.split(), "x"], input=stdin,
                           cwd=tmp_path, capture_output=True, text=True,
                           timeout=300)
    completed = tfdtape_run("--quiet", *form.split(), "x", stdin=stdin,
                            cwd=tmp_path)
    assert plain.returncode == completed.returncode == 0, completed.stderr
    assert completed.stdout == plain.stdout
    assert "{} ['__annotations__', '__builtins__', '__cached__', '__doc__', " \
        "'__file__', '__loader__', '__name__', '__package__', '__spec__', " \
        "'sys']" in completed.stdout


@pytest.mark.parametrize("make, message", [
    (lambda path: path.mkdir(), "a directory without __main__.py"),
    (lambda path: zipfile.ZipFile(path, "w").close(),
     "a zip archive without __main__.py"),
], ids=["directory", "zip"])
def test_nothing_to_run_inside_is_exit_2(tmp_path, make, message):
    make(tmp_path / "target")
    completed = tfdtape_run(str(tmp_path / "target"))
    assert completed.returncode == 2
    assert completed.stderr == f"tfdtape: run: cannot run {tmp_path / 'target'}: {message}\n"


@pytest.mark.parametrize("options", [[], ["--no-install"]],
                         ids=["tfdtape", "stock observed"])
def test_a_none_inside_a_tf_function_is_located_at_its_gradient_line(
        tmp_path, options):
    script = SCRIPTS / "function_nones.py"
    lines = {line.split("# NONE: ")[1]: number for number, line in enumerate(
        script.read_text().splitlines(), start=1) if "# NONE: " in line}
    completed = tfdtape_run(*options, "--json", str(tmp_path / "r.json"),
                            str(script))
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout == ("gradients: [12.0, 12.0] 2.0 3.0 [5.0, 5.0]\n"
                                "to_graph: 7.0\n")
    report = json.loads((tmp_path / "r.json").read_text())
    assert sorted((item["source"], item["context"], item["location"],
                   item["count"]) for item in report["none_gradients"]) == sorted([
        ("unused:0", "no strategy", f"{script}:{lines['no strategy']}", 1),
        ("unused:0", "no strategy", f"{script}:{lines['multiline']}", 1),
        ("unused:0", "replica", f"{script}:{lines['replica']}", 2),
        ("unused:0", "replica", f"{script}:{lines['nested replica']}", 2),
        ("plain_unused:0", "no strategy", "?", 1),
        ("plain_unused:0", "no strategy", f"{script}:{lines['eager chain']}", 1)])


@pytest.mark.parametrize("program", [
    "# -*- coding: latin-1 -*-\nprint('caf\xe9')\n".encode("latin-1"),
    b"\xef\xbb\xbfprint('with a byte order mark')\n",
], ids=["coding cookie", "byte order mark"])
def test_a_program_on_stdin_keeps_its_encoding(tmp_path, program):
    (tmp_path / "program.py").write_bytes(program)
    outputs = []
    for runner in ([sys.executable], [sys.executable, "-m", "tfdtape", "run",
                                      "--quiet"]):
        with open(tmp_path / "program.py", "rb") as stdin:  # as `< program.py`
            completed = subprocess.run(runner + ["-"], stdin=stdin,
                                       capture_output=True, timeout=120)
        assert completed.returncode == 0, completed.stderr
        outputs.append(completed.stdout)
    assert outputs[0] == outputs[1] and outputs[0].strip()


def test_the_scripts_logging_configuration_is_its_own(tmp_path):
    script = tmp_path / "logs.py"
    script.write_text(
        "import logging\n"
        "import tensorflow as tf\n"
        "import tfdtape\n"
        "print(len(logging.getLogger().handlers), flush=True)\n"
        "logging.basicConfig(level=logging.INFO, format='MINE %(levelname)s "
        "%(message)s')\n"
        "logging.info('epoch 1 done')\n"
        "tf.get_logger().warning('from tensorflow')\n")
    stderrs = []
    for runner in ([sys.executable], [sys.executable, "-m", "tfdtape", "run",
                                      "--quiet"]):
        completed = subprocess.run(runner + [str(script)], capture_output=True,
                                   text=True, timeout=300,
                                   env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        assert completed.returncode == 0, completed.stderr
        assert completed.stdout == "0\n"
        stderrs.append([line for line in completed.stderr.splitlines()
                        if "epoch" in line or "from tensorflow" in line])
    assert stderrs[0] == stderrs[1] == [
        "MINE INFO epoch 1 done", "WARNING:tensorflow:from tensorflow",
        "MINE WARNING from tensorflow"]


@pytest.mark.pip_installed
def test_pytest_under_run_does_not_warn_that_tfdtape_was_imported(tmp_path):
    """pytest marks the packages of a pytest11 plugin's distribution for
    assertion rewriting, so it would warn that tfdtape (imported by run) is
    imported already; the downstream test checks that its own module was
    still rewritten."""
    assert [entry.value for entry in importlib.metadata.entry_points(
        group="pytest11") if entry.name == "tfdtape_pytest"] == ["tfdtape_pytest"]
    (tmp_path / "test_small.py").write_text(
        "def test_rewritten():\n    assert '@py_builtins' in globals()\n")
    completed = tfdtape_run(
        "--quiet", "-m", "pytest", "-q", "-p", "no:cacheprovider",
        "-W", "error::pytest.PytestAssertRewriteWarning", "test_small.py",
        cwd=tmp_path)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "1 passed" in completed.stdout
    assert "already imported" not in completed.stdout + completed.stderr


def test_a_forked_child_does_not_report(tmp_path):
    script = tmp_path / "forks.py"
    script.write_text("import os\n"
                      "pid = os.fork()\n"
                      # One write each: print's two writes interleave.
                      "os.write(1, b'child\\n' if pid == 0 else b'parent\\n')\n"
                      "if pid:\n    os.waitpid(pid, 0)\n")
    completed = tfdtape_run("--json", str(tmp_path / "r.json"), str(script))
    assert completed.returncode == 0, completed.stderr
    assert sorted(completed.stdout.split()) == ["child", "parent"]
    assert completed.stderr.count("tfdtape run: ") == 1


def test_summary_paths_are_relative_to_where_the_run_started(tmp_path):
    script = tmp_path / "wanders.py"
    script.write_text("import os\n"
                      "import tensorflow as tf\n"
                      "v = tf.Variable(1.0, name='v')\n"
                      "unused = tf.Variable(1.0, name='unused')\n"
                      "os.chdir('/')\n"
                      "with tf.GradientTape() as tape:\n"
                      "    y = v * 2.0\n"
                      "tape.gradient(y, [v, unused])\n")
    completed = tfdtape_run("wanders.py", cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert ", once at wanders.py:8\n" in summary_of(completed.stderr)


def test_a_stand_in_for_tensorflow_is_not_tensorflow(tmp_path):
    script = tmp_path / "mocked.py"
    script.write_text("import sys, types\n"
                      "sys.modules['tensorflow'] = types.ModuleType('tensorflow')\n")
    completed = tfdtape_run("--json", str(tmp_path / "r.json"), str(script))
    assert completed.returncode == 0, completed.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["tensorflow"] is None and report["complete"] is True
    assert "did not see" not in completed.stderr


def test_tfdtape_asked_for_inside_a_no_install_run_says_why_not(tmp_path):
    script = tmp_path / "asks.py"
    script.write_text("import tensorflow as tf\n"
                      "import tfdtape\n"
                      "for ask in (tfdtape.install, tfdtape.trace().__enter__):\n"
                      "    try:\n"
                      "        ask()\n"
                      "    except (RuntimeError, tfdtape.PatchConflictError) as error:\n"
                      "        print(type(error).__name__, str(error)[:60])\n"
                      "        print(str(error).endswith('run without --no-install "
                      "to have tfdtape installed.'))\n")
    completed = tfdtape_run("--quiet", "--no-install", str(script))
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.splitlines() == [
        "PatchConflictError tfdtape: cannot install: TensorFlow's functions are "
        "observed", "True",
        "RuntimeError tfdtape: cannot open a trace: tfdtape is not installed ("
        "tfdt", "True"]


def test_a_none_is_not_counted_as_a_total_derivative(tmp_path):
    script = tmp_path / "cross.py"
    script.write_text("import tensorflow as tf\n"
                      "from tfdtape import testing\n"
                      "strategy = testing.mirrored_strategy(2)\n"
                      "with strategy.scope():\n"
                      "    w = tf.Variable(3.0, name='w')\n"
                      "    unused = tf.Variable(1.0, name='unused')\n"
                      "    with tf.GradientTape() as tape:\n"
                      "        loss = w * 2.0\n"
                      "    print(tape.gradient(loss, [w, unused]))\n")
    completed = tfdtape_run("--quiet", "--json", str(tmp_path / "r.json"),
                            str(script))
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.endswith(", None]\n")
    report = json.loads((tmp_path / "r.json").read_text())
    assert [item["source"] for item in report["none_gradients"]] == ["unused:0"]
    assert [(item["source"], item["components"])
            for item in report["total_derivatives"]] == [("w:0", 2)]
