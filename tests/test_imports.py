"""`import tfdtape` where TensorFlow or absl-py is missing: one clear error
naming the missing module and the install command."""

import ast
import os
import pathlib
import subprocess
import sys

import absl

REPOSITORY = pathlib.Path(__file__).resolve().parent.parent


def import_tfdtape_with(path_entries, autoinstall="1"):
    """Imports tfdtape in `python -S` (no site-packages) with only
    `path_entries` and the repository on sys.path."""
    program = ("import sys\n"
               f"sys.path[:0] = {[str(p) for p in path_entries]!r}\n"
               f"sys.path.insert(0, {str(REPOSITORY)!r})\n"
               "import tfdtape\n"
               "print('imported', tfdtape.__version__)\n")
    env = dict(os.environ, TFDTAPE_AUTOINSTALL=autoinstall)
    env.pop("PYTHONPATH", None)
    return subprocess.run([sys.executable, "-S", "-c", program], env=env,
                          capture_output=True, text=True, timeout=120)


def last_line(text):
    return text.strip().splitlines()[-1]


def test_without_absl_and_tensorflow():
    completed = import_tfdtape_with([])
    assert completed.returncode == 1
    assert last_line(completed.stderr) == (
        "ModuleNotFoundError: tfdtape: the module "
        "'absl' (absl-py) is not installed. Install tfdtape with TensorFlow: "
        'pip install "tfdtape[cpu]" (or pip install "tfdtape[tensorflow]"); '
        "set TFDTAPE_AUTOINSTALL=0 to import tfdtape without it")


def test_without_tensorflow(tmp_path):
    only_absl = tmp_path / "site"
    only_absl.mkdir()
    (only_absl / "absl").symlink_to(pathlib.Path(absl.__file__).parent)
    completed = import_tfdtape_with([only_absl])
    assert completed.returncode == 1
    assert last_line(completed.stderr) == (
        "ModuleNotFoundError: tfdtape: the module "
        "'tensorflow' (tensorflow-cpu or tensorflow) is not installed. Install "
        'tfdtape with TensorFlow: pip install "tfdtape[cpu]" (or pip install '
        '"tfdtape[tensorflow]"); set TFDTAPE_AUTOINSTALL=0 to import tfdtape '
        "without it")


def test_without_autoinstall_nothing_is_needed():
    completed = import_tfdtape_with([], autoinstall="0")
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith("imported ")


def test_install_by_hand_without_absl_names_the_install_command():
    program = ("import sys\n"
               f"sys.path.insert(0, {str(REPOSITORY)!r})\n"
               "import tfdtape\n"
               "tfdtape.install()\n")
    env = dict(os.environ, TFDTAPE_AUTOINSTALL="0")
    env.pop("PYTHONPATH", None)
    completed = subprocess.run([sys.executable, "-S", "-c", program], env=env,
                               capture_output=True, text=True, timeout=120)
    assert completed.returncode == 1
    assert last_line(completed.stderr).startswith(
        "ModuleNotFoundError: tfdtape: the module 'absl' (absl-py) is not "
        'installed. Install tfdtape with TensorFlow: pip install "tfdtape[cpu]"')


def module_names():
    """Every module of the package by its name below `tfdtape.`, such as
    "events" or "cli.run_report" (a package by its own name: "cli")."""
    package = REPOSITORY / "tfdtape"
    names = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            names[".".join(parts)] = path
    return names


def imports_between_modules():
    """{module: the tfdtape modules it imports, at module level or inside a
    function}, read from the source; names as `module_names` gives them."""
    modules = module_names()
    imported = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and (
                    node.module == "tfdtape" or node.module.startswith("tfdtape.")):
                base = node.module.removeprefix("tfdtape").lstrip(".")
                for alias in node.names:
                    child = f"{base}.{alias.name}" if base else alias.name
                    found.add(child if child in modules else base)
            elif isinstance(node, ast.Import):
                found |= {alias.name.removeprefix("tfdtape.") for alias in node.names
                          if alias.name.startswith("tfdtape.")}
        imported[name] = (found & set(modules)) - {name, ""}
    return imported


def cycles(graph):
    """Every cycle of `graph` ({node: successors}), each as a tuple of
    nodes starting at its smallest."""
    found = set()

    def walk(path):
        for successor in sorted(graph[path[-1]]):
            if successor == path[0]:
                start = path.index(min(path))
                found.add(tuple(path[start:] + path[:start]))
            elif successor not in path and successor > path[0]:
                walk(path + [successor])

    for node in sorted(graph):
        walk([node])
    return sorted(found)


def test_cycle_finder_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        ("a", "b", "c")]


def test_the_package_has_no_import_cycles():
    graph = imports_between_modules()
    assert graph["patching"] >= {"targets", "events"}  # the reader reads
    assert graph["cli.run_command"] >= {"cli.run_session", "cli.script_runner"}
    assert cycles(graph) == []


def test_the_library_never_imports_the_command_line():
    graph = imports_between_modules()
    library = {name for name in graph
               if name != "__main__" and not name.startswith("cli")}
    assert {name: sorted(imported for imported in graph[name]
                         if imported.startswith("cli"))
            for name in library} == {name: [] for name in library}
    assert graph["__main__"] == {"cli.main"}
