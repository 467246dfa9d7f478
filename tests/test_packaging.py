"""How tfdtape ships: the wheel built from a clean checkout, its console
script and pytest11 entry point in a fresh environment, and the `tfdtape`
command behaving as `python -m tfdtape` does.

These need the repository's packaging files and a pip-installed tfdtape, so
Bazel has no target for them; `pytest tests` runs them.
"""

import os
import pathlib
import re
import shutil
import subprocess
import sys
import venv
import zipfile

import pytest

from tfdtape import versions

REPOSITORY = pathlib.Path(__file__).resolve().parent.parent
ENVIRONMENT = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
ENVIRONMENT.pop("TF_CONFIG", None)


UNTRACKED = ("*.egg-info", "__pycache__", ".pytest_cache", ".venv", ".matrix",
             ".venv-lint", ".release", "bazel-*", "build", "dist", "reports",
             ".venv-docs", ".site", "site")
"""What .gitignore keeps out of a clone, for a tree that is not a git one."""


def checkout_of_repository(destination):
    """Copies what a clean clone holds to `destination`: git's tracked files
    and new files it does not ignore, or, outside a git work tree (such as
    tools/matrix.py's snapshot of HEAD), the tree less UNTRACKED."""
    if not (REPOSITORY / ".git").exists():
        shutil.copytree(REPOSITORY, destination, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(*UNTRACKED))
        return destination
    listed = subprocess.run(
        ["git", "-C", str(REPOSITORY), "ls-files", "-z", "--cached", "--others",
         "--exclude-standard"], capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = REPOSITORY / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel `pip wheel` builds from a clean checkout."""
    source = checkout_of_repository(tmp_path_factory.mktemp("checkout"))
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                    "--no-build-isolation", "-q", "-w", str(dist), str(source)],
                   check=True, capture_output=True, timeout=300)
    (built,) = dist.glob("tfdtape-*.whl")
    return built


def test_wheel_carries_the_package_and_both_entry_points(wheel):
    assert wheel.name == f"tfdtape-{versions.RELEASE}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = f"tfdtape-{versions.RELEASE}.dist-info"
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
        metadata = archive.read(f"{info}/METADATA").decode()
    modules = sorted(path.relative_to(REPOSITORY).as_posix()
                     for path in (REPOSITORY / "tfdtape").rglob("*.py"))
    assert sorted(name for name in names if name.startswith("tfdtape/")) == modules
    assert "tfdtape_pytest.py" in names
    assert not [name for name in names if name.startswith(("tests/", "tools/"))]
    sections = {}
    for line in entry_points.splitlines():
        if line.startswith("["):
            section = sections.setdefault(line.strip("[]"), [])
        elif line.strip():
            section.append(line.replace(" ", ""))
    assert sections == {"console_scripts": ["tfdtape=tfdtape.__main__:main"],
                        "pytest11": ["tfdtape_pytest=tfdtape_pytest"]}
    requirements = [line for line in metadata.splitlines()
                    if line.startswith("Requires-Dist: tensorflow-cpu")]
    assert len(requirements) == 1
    bounds = set(versions.TENSORFLOW_REQUIREMENT.split(","))
    assert set(requirements[0].split()[1][len("tensorflow-cpu"):]
               .rstrip(";").split(",")) == bounds


def test_wheel_installs_into_a_fresh_environment(wheel, tmp_path):
    environment_dir = tmp_path / "fresh"
    venv.create(environment_dir, with_pip=True)
    python = environment_dir / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-index",
                    "--no-deps", str(wheel)], check=True, capture_output=True,
                   timeout=300)
    command = environment_dir / "bin" / "tfdtape"
    version = subprocess.run([command, "--version"], capture_output=True,
                             text=True, env=ENVIRONMENT, timeout=60)
    assert (version.returncode, version.stdout, version.stderr) == (
        0, f"tfdtape {versions.RELEASE}\n", "")
    # No TensorFlow here: the command says so in one line, exit status 2.
    info = subprocess.run([command, "info"], capture_output=True, text=True,
                          env=ENVIRONMENT, timeout=60)
    assert info.returncode == 2
    assert info.stdout == ""
    assert info.stderr.startswith("tfdtape: TensorFlow cannot be imported "
                                  "(ModuleNotFoundError: No module named "
                                  "'tensorflow')"), info.stderr
    assert len(info.stderr.splitlines()) == 1
    found = subprocess.run(
        [python, "-c", "from importlib import metadata\n"
         "for group in ('console_scripts', 'pytest11'):\n"
         "    for point in metadata.entry_points(group=group):\n"
         "        if point.dist.name == 'tfdtape':\n"
         "            print(group, point.name, point.value)\n"],
        capture_output=True, text=True, check=True, timeout=60)
    assert found.stdout.splitlines() == [
        "console_scripts tfdtape tfdtape.__main__:main",
        "pytest11 tfdtape_pytest tfdtape_pytest"]


TENSORFLOW_CHATTER = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\)|"
    r"[IWE]\d{4} \d\d:\d\d:\d+\.\d+ )")


def without_chatter(stderr):
    """`stderr` without the log lines TensorFlow's C++ runtime writes at start-up
    (their timestamps and thread ids differ from process to process)."""
    return "".join(line for line in stderr.splitlines(keepends=True)
                   if not TENSORFLOW_CHATTER.match(line))


def untimed(report):
    """verify's report without the seconds each check took."""
    return re.sub(r"\b\d+\.\d\ds\b", "#.##s", report)


def installed_command():
    """The `tfdtape` console script of this environment."""
    command = pathlib.Path(sys.executable).parent / "tfdtape"
    assert command.is_file(), (
        f"no tfdtape console script beside {sys.executable}: install tfdtape "
        "with pip (README's test command does)")
    return str(command)


@pytest.mark.pip_installed
@pytest.mark.parametrize("arguments", [
    ["--version"],
    ["verify", "--only", "replica_context_eager", "--replicas", "2"],
    ["verify", "--only", "no_such_check"],
    ["run"],
    ["bogus"],
], ids=["--version", "verify", "verify with a bad check", "run without a script",
        "unknown command"])
def test_console_script_is_python_dash_m(arguments):
    results = [subprocess.run(command + arguments, capture_output=True,
                              text=True, env=ENVIRONMENT, timeout=600)
               for command in ([installed_command()],
                               [sys.executable, "-m", "tfdtape"])]
    script, module = results
    assert script.returncode == module.returncode, (script.stderr, module.stderr)
    assert untimed(script.stdout) == untimed(module.stdout)
    assert without_chatter(script.stderr) == without_chatter(
        module.stderr).replace("python -m tfdtape", "tfdtape")


@pytest.mark.pip_installed
def test_console_script_runs_a_script_as_python_dash_m_does(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import sys\n"
        "import tensorflow as tf\n"
        "v = tf.Variable(3.0)\n"
        "with tf.GradientTape() as tape:\n"
        "    y = v * v\n"
        "print(float(tape.gradient(y, v)), sys.argv[1:], sys.path[0] == "
        f"{str(tmp_path)!r})\n"
        "import tfdtape\n"
        "print(tfdtape.is_installed())\n"
        "sys.exit(3)\n")
    results = [subprocess.run(command + ["run", "--json", str(tmp_path / name),
                                         str(script), "a", "-b"],
                              capture_output=True, text=True, env=ENVIRONMENT,
                              cwd=tmp_path, timeout=300)
               for command, name in (([installed_command()], "script.json"),
                                     ([sys.executable, "-m", "tfdtape"],
                                      "module.json"))]
    script_run, module_run = results
    assert script_run.returncode == module_run.returncode == 3
    assert script_run.stdout == module_run.stdout == "6.0 ['a', '-b'] True\nTrue\n"
    assert without_chatter(script_run.stderr) == without_chatter(module_run.stderr)
    assert ((tmp_path / "script.json").read_text() ==
            (tmp_path / "module.json").read_text())


@pytest.mark.pip_installed
def test_console_script_does_not_install_tfdtape_on_import():
    completed = subprocess.run([installed_command(), "info"],
                               capture_output=True, text=True, env=ENVIRONMENT,
                               timeout=300)
    assert completed.returncode == 0, completed.stderr
    assert ("installed in this process: no (`import tfdtape` installs)"
            in completed.stdout.splitlines())
