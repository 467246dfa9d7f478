"""The pytest11 plugin, exercised the way a downstream project uses it."""

import subprocess
import sys

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


def test_downstream_tests_use_the_fixtures(pytester):
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
    result = pytester.runpytest_subprocess()
    result.stdout.fnmatch_lines(["*tfdtape_replicas must be a positive integer, found 'many'*"])
    assert result.ret != 0
