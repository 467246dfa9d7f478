"""The pytest plugin, exercised the way downstream projects use it.

Where tfdtape is pip-installed, pytest loads the plugin through its `pytest11`
entry point; where it is not (a Bazel monorepo depending on
`@tfdtape//:tfdtape`), `-p tfdtape_pytest` loads it. Both name it
`tfdtape_pytest`, so passing `-p` where it is installed too is harmless.
"""

import importlib.metadata
import json
import subprocess
import sys

import pytest

pytest_plugins = ["pytester"]

DOWNSTREAM_TEST = '''
import pytest
import tensorflow as tf

@pytest.mark.tfdtape_replicas(2)
def test_container_is_watched(mirrored_strategy, tfdtape_installed):
    with mirrored_strategy.scope():
        v = tf.Variable(3.0)
    seen = []
    def step():
        with tf.GradientTape() as tape:
            loss = v * v
        seen.append(tape.watched_variables()[0] is v)
        return tape.gradient(loss, v)
    grads = mirrored_strategy.run(step)
    assert seen == [True, True]
    assert [float(g) for g in mirrored_strategy.experimental_local_results(grads)] == [6.0, 6.0]

@pytest.mark.tfdtape_replicas(2)
def test_control_watches_components(mirrored_strategy, pre_seed):
    with mirrored_strategy.scope():
        v = tf.Variable(3.0)
    seen = []
    def step():
        with tf.GradientTape() as tape:
            v * v
        seen.append(tape.watched_variables()[0] is v)
    mirrored_strategy.run(step)
    assert seen == [False, False]
'''


def test_plugin_loads_without_tensorflow():
    code = ("import sys, tfdtape_pytest\n"
            "print('tensorflow' in sys.modules, 'tfdtape' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_downstream_tests_use_the_fixtures_loaded_with_p(pytester):
    pytester.makepyfile(test_downstream=DOWNSTREAM_TEST)
    pytester.makeini("[pytest]\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider",
                                           "-p", "tfdtape_pytest")
    result.assert_outcomes(passed=2)


@pytest.mark.pip_installed
def test_the_entry_point_loads_the_plugin_where_tfdtape_is_installed(pytester):
    entry_points = importlib.metadata.entry_points(group="pytest11")
    assert [(e.name, e.value) for e in entry_points
            if e.value == "tfdtape_pytest"] == [("tfdtape_pytest",
                                                  "tfdtape_pytest")]
    pytester.makepyfile(test_downstream=DOWNSTREAM_TEST)
    pytester.makeini("[pytest]\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_bad_replica_marker_is_a_usage_error(pytester):
    pytester.makepyfile(test_bad='''
import pytest
@pytest.mark.tfdtape_replicas("many")
def test_x(virtual_cpus):
    pass
''')
    result = pytester.runpytest_subprocess("-p", "tfdtape_pytest")
    result.stdout.fnmatch_lines(["*tfdtape_replicas must be a positive integer, found 'many'*"])
    assert result.ret != 0


def test_tfdtape_report_for_a_test_run(pytester):
    pytester.makepyfile(test_downstream=DOWNSTREAM_TEST)
    pytester.makeini("[pytest]\n")
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "tfdtape_pytest",
        "--tfdtape-report", "tapes.json")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*= tfdtape =*", "tfdtape run: *exited with status 0",
                                 "  replica 0,1  container * 1 * 4 * 0",
                                 "report written to tapes.json"])
    report = json.loads((pytester.path / "tapes.json").read_text())
    assert report["schema"] == "tfdtape-run/2" and report["exit_status"] == 0
    assert report["command"][0] == "pytest" and report["installed"] is True
    reads = [w for w in report["watched"] if w["kind"] == "access"]
    # The tfdtape_installed test's replicas watched the container. The
    # pre_seed test ran with tfdtape uninstalled: nothing reports there.
    assert {(w["how"], w["replica"]) for w in reads} == {
        ("container", 0), ("container", 1)}
    assert report["complete"] is False  # pre_seed uninstalled tfdtape


def test_tfdtape_report_to_an_unwritable_path_is_a_usage_error(pytester):
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess(
        "-p", "tfdtape_pytest", "--tfdtape-report", "/nonexistent-dir/r.json")
    result.stderr.fnmatch_lines(["*tfdtape: --tfdtape-report /nonexistent-dir/"
                                 "r.json: cannot write there*"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


STOCK_TEST = '''
import pytest

@pytest.mark.tfdtape_replicas(2)
def test_only_a_strategy(mirrored_strategy):
    from tfdtape import patching
    assert not patching.is_installed()

def test_installed_inside(tfdtape_installed):
    from tfdtape import patching
    assert patching.is_installed()

def test_and_stock_again():
    from tfdtape import patching
    assert not patching.is_installed()
'''


def test_a_strategy_fixture_leaves_tensorflow_stock(pytester):
    pytester.makepyfile(test_stock=STOCK_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider",
                                           "-p", "tfdtape_pytest")
    result.assert_outcomes(passed=3)
