"""A downstream py_test depending on @tfdtape: containers are watched."""

import os
import unittest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # pylint: disable=g-import-not-at-top

import tfdtape  # pylint: disable=g-import-not-at-top
from tfdtape import testing  # pylint: disable=g-import-not-at-top

STRATEGY = testing.mirrored_strategy(2)


class ConsumerTest(unittest.TestCase):

    def test_tfdtape_comes_from_the_bazel_dependency(self):
        # Runfiles hold the dependency under its repository name, @tfdtape.
        self.assertTrue(tfdtape.__file__.endswith(
            os.path.join(".runfiles", "tfdtape", "tfdtape", "__init__.py")),
            tfdtape.__file__)
        self.assertTrue(tfdtape.is_installed())

    def test_replica_context_watches_the_mirrored_variable(self):
        with STRATEGY.scope():
            v = tf.Variable(3.0)
        watched = []

        def step():
            with tf.GradientTape() as tape:
                loss = v * v
            watched.append(tape.watched_variables())
            return tape.gradient(loss, v)

        gradients = STRATEGY.run(step)
        self.assertEqual(len(watched), 2)
        for found in watched:
            self.assertEqual(len(found), 1)
            self.assertIs(found[0], v)
        self.assertEqual(
            [float(g) for g in STRATEGY.experimental_local_results(gradients)],
            [6.0, 6.0])

    def test_cross_replica_gradient_sums_the_components(self):
        with STRATEGY.scope():
            v = tf.Variable(3.0)
            with tf.GradientTape() as tape:
                loss = v.values[0] + 2.0 * v.values[1]
            self.assertEqual(float(tape.gradient(loss, v)), 3.0)


if __name__ == "__main__":
    unittest.main()
