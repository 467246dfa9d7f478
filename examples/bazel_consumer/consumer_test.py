"""A downstream py_test depending on @tfdtape, written with tfdtape's pytest
fixtures, with no pip install of tfdtape.

Without a pip install there is no pytest11 entry point, so this file runs
pytest itself with `-p tfdtape_pytest`, which loads the plugin from the
@tfdtape dependency (a conftest.py could say `pytest_plugins =
["tfdtape_pytest"]` instead).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pytest
import tensorflow as tf

import tfdtape


def test_tfdtape_comes_from_the_bazel_dependency():
    # Runfiles hold the dependency under its repository name, @tfdtape.
    assert tfdtape.__file__.endswith(
        os.path.join(".runfiles", "tfdtape", "tfdtape", "__init__.py")), (
            tfdtape.__file__)
    import importlib.metadata
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.distribution("tfdtape")  # not pip-installed


@pytest.mark.tfdtape_replicas(2)
def test_replica_context_watches_the_mirrored_variable(mirrored_strategy,
                                                       tfdtape_installed):
    with mirrored_strategy.scope():
        v = tf.Variable(3.0)
    watched = []

    def step():
        with tf.GradientTape() as tape:
            loss = v * v
        watched.append(tape.watched_variables())
        return tape.gradient(loss, v)

    gradients = mirrored_strategy.run(step)
    assert len(watched) == 2
    for found in watched:
        assert len(found) == 1 and found[0] is v
    assert [float(g) for g in
            mirrored_strategy.experimental_local_results(gradients)] == [6.0, 6.0]


@pytest.mark.tfdtape_replicas(2)
def test_cross_replica_gradient_sums_the_components(mirrored_strategy,
                                                     tfdtape_installed):
    with mirrored_strategy.scope():
        v = tf.Variable(3.0)
        with tf.GradientTape() as tape:
            loss = v.values[0] + 2.0 * v.values[1]
        assert float(tape.gradient(loss, v)) == 3.0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider",
                          "-p", "tfdtape_pytest"]))
