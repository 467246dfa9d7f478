"""`import tfdtape` where TensorFlow or absl-py is missing: one clear error
naming the missing module and the install command. And the imports between
tfdtape's modules: no cycle, none against CONTRIBUTING.md's floor plan, none
from the library into the command line."""

import ast
import os
import pathlib
import re
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
    "events" or "cli.run_report" (a package by its own name, "cli"; the
    package's own `__init__.py` as "__init__")."""
    package = REPOSITORY / "tfdtape"
    names = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
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


def floor_plan():
    """{group: (its modules, the groups it may import)} as CONTRIBUTING.md's
    floor-plan table gives them ("cli.*" stands for every module of cli,
    "horovod.*" for every module of horovod)."""
    text = (REPOSITORY / "CONTRIBUTING.md").read_text(encoding="utf-8")
    table = text.split("## The floor plan", 1)[1].split("\n\n")
    rows = [line for block in table if block.lstrip().startswith("| group")
            for line in block.strip().splitlines()[2:]]
    plan = {}
    for row in rows:
        group, modules, _, may_import = [cell.strip() for cell in row.strip("|").split("|")]
        names = set(re.findall(r"`([^`]+)`", modules))
        allowed = (set() if may_import == "—" else
                   {"*"} if may_import == "every group" else
                   {name.strip() for name in may_import.split(",")})
        plan[group] = (names, allowed)
    return plan


def group_of(module, plan):
    found = [group for group, (names, _) in plan.items()
             if module in names or any(name.endswith(".*") and
                                       module.startswith(name[:-1]) for name in names)]
    assert len(found) == 1, f"{module} is in {found or 'no group'} of the floor plan"
    return found[0]


def test_every_module_is_in_one_group_of_the_floor_plan():
    plan = floor_plan()
    assert list(plan) == ["base", "recording", "totals", "keras", "install",
                          "diagnostics", "horovod", "cli"]
    modules = module_names()
    for module in modules:
        group_of(module, plan)
    listed = set().union(*(names for names, _ in plan.values())) - {
        "cli.*", "horovod.*", "launchers.*"}
    assert listed <= set(modules), listed - set(modules)


def test_every_import_follows_the_floor_plan():
    plan = floor_plan()
    against = []
    for module, imported in sorted(imports_between_modules().items()):
        group = group_of(module, plan)
        allowed = plan[group][1]
        for other in sorted(imported):
            other_group = group_of(other, plan)
            if other_group != group and "*" not in allowed and other_group not in allowed:
                against.append(f"{module} ({group}) imports {other} ({other_group})")
    assert against == []


def test_the_floor_plan_check_sees_an_import_up_the_layers():
    plan = floor_plan()
    assert group_of("tape_functions", plan) == "recording"
    assert "diagnostics" not in plan[group_of("gradient_tape", plan)][1]
    assert group_of("explaining", plan) == "diagnostics"
