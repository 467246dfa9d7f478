"""tools/matrix.py: a pinned build the registry no longer serves is skipped in
one line, not failed; the compatibility table keeps the rows of builds not
checked, each naming its commit.

These run pip against the package registry and need the repository's
tools/, so Bazel has no target for them; `pytest tests` runs them.
"""

import pathlib
import runpy
import types

REPOSITORY = pathlib.Path(__file__).resolve().parent.parent
matrix = types.SimpleNamespace(**runpy.run_path(str(REPOSITORY / "tools" / "matrix.py")))


def test_a_build_the_registry_does_not_serve_is_skipped_not_failed(tmp_path):
    build = matrix.Build("tf-nightly 0.0.0.dev0", ("tf-nightly==0.0.0.dev0",),
                         untested=True)
    outcome = matrix.check_build(build, tmp_path, REPOSITORY)
    assert outcome.installed == "not served"
    assert outcome.notes == [
        "the registry no longer serves tf-nightly==0.0.0.dev0"]
    assert outcome.tests == outcome.verify == "not run"
    assert matrix.passed(outcome)


def outcome(version, tests, verify, installed="yes"):
    return matrix.Outcome(version, installed=installed, tests=tests,
                          verify=verify)


def test_only_a_full_pass_passes():
    assert matrix.passed(outcome("2.21.0", "800 passed, 6 warnings", "13/13 passed"))
    assert matrix.passed(outcome("2.12.1", "754 passed, 2 skipped", "13/13 passed"))
    assert not matrix.passed(outcome("2.21.0", "1 failed, 799 passed", "13/13 passed"))
    assert not matrix.passed(outcome("2.21.0", "800 passed, 2 errors", "13/13 passed"))
    assert not matrix.passed(outcome("2.21.0", "800 passed", "12/13 passed"))
    assert not matrix.passed(outcome("2.21.0", "not run", "not run", "failed"))


def test_the_table_replaces_the_rows_checked_and_keeps_the_others(tmp_path):
    table = tmp_path / "compatibility.md"
    matrix.write_table([outcome("2.21.0", "800 passed", "13/13 passed"),
                        outcome("2.12.1", "754 passed", "13/13 passed")],
                       table, "aaaaaaa")
    matrix.write_table([outcome(matrix.NIGHTLY_NAME, "800 passed", "13/13 passed"),
                        outcome("2.21.0", "1 failed, 799 passed", "13/13 passed")],
                       table, "bbbbbbb")
    rows = [line for line in table.read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| TensorFlow")]
    assert rows == [
        "| 2.12.1 | aaaaaaa | yes | 754 passed | 13/13 passed | - |",
        "| 2.21.0 | bbbbbbb | yes | 1 failed, 799 passed | 13/13 passed | - |",
        f"| {matrix.NIGHTLY_NAME} | bbbbbbb | yes | 800 passed | 13/13 passed | - |"]


def test_the_two_runs_of_the_test_command_count_as_one():
    assert matrix.combined_summary([
        "1085 passed, 20 skipped, 3 warnings, 4 deselected",
        "4 passed, 1105 deselected, 1 warning"]) == "1089 passed, 20 skipped"
    assert matrix.combined_summary(["1 failed, 99 passed", "4 passed"]) == (
        "1 failed, 103 passed")
    assert matrix.combined_summary(["exit 4", "4 passed"]) == "exit 4; 4 passed"


def test_the_failed_tests_are_named_from_pytests_short_summary():
    log = (
        "...F..\n"
        "=========================== short test summary info ============================\n"
        "FAILED tests/test_a.py::test_b[options0] - AssertionError: x\n"
        "ERROR tests/test_c.py::test_d - RuntimeError\n"
        "E   FAILED tests/not_a_summary_line\n"
        "2 failed, 5 passed in 3.0s\n")
    assert matrix.FAILED_TEST.findall(log) == [
        "FAILED tests/test_a.py::test_b[options0] - AssertionError: x",
        "ERROR tests/test_c.py::test_d - RuntimeError"]
