"""The scale traps of a tape around strategy.run: a MEAN of
compute_average_loss gives 1/N of the gradient (tfdtape.cli.scale_traps: the
run report warns, and never about the correct programs beside it); a total
applied inside strategy.run would count once per replica (refused).

In-process with a recorder (as `python -m tfdtape run` has one), on
MirroredStrategy(4), Keras 3 and Keras 2, eagerly and in a tf.function;
and once end to end through `python -m tfdtape run`. Stock TensorFlow
cannot run the loop (the handle error at tape.gradient).
"""

import contextlib
import json
import shutil

import numpy as np
import pytest
import tensorflow as tf

from keras_models import KERAS_MODULES
from keras_models import is_keras3
from keras_models import keras_module
from run_helpers import SCRIPTS
from run_helpers import Recording
from run_helpers import script_line
from run_helpers import summary_of
from run_helpers import tfdtape_run
from tfdtape.cli import scale_traps
from tfdtape.testing import PATCHED_CONFIGURATIONS

pytestmark = pytest.mark.per_release

REPLICAS = 4
FEATURES = np.linspace(-1.0, 1.0, 24, dtype=np.float32).reshape(8, 3)
LABELS = np.linspace(1.0, 0.2, 8, dtype=np.float32).reshape(8, 1)


class Program:
    """A Dense(1) model on the strategy, one batch of 8 split over its
    replicas, and the pieces of the programs below."""

    def __init__(self, strategy, keras_name):
        self.strategy = strategy
        self.keras = keras_module(keras_name)
        with strategy.scope():
            self.model = self.keras.Sequential([self.keras.Input((3,)),
                                                self.keras.layers.Dense(1)])
            self.model.set_weights([np.full((3, 1), 0.5, np.float32),
                                    np.zeros(1, np.float32)])
            self.optimizer = self.keras.optimizers.SGD(0.1)
        dataset = tf.data.Dataset.from_tensor_slices((FEATURES, LABELS)).batch(8)
        self.x, self.y = next(iter(strategy.experimental_distribute_dataset(dataset)))

    def per_example(self, x, y):
        error = self.model(x) - y
        return tf.reduce_sum(error * error, axis=1)

    def average_loss(self, x, y):
        return tf.nn.compute_average_loss(self.per_example(x, y), global_batch_size=8)

    def mean_loss(self, x, y):
        return tf.reduce_mean(self.per_example(x, y))

    def local_average_loss(self, x, y):
        """compute_average_loss told the replica's own batch: a mean."""
        return tf.nn.compute_average_loss(self.per_example(x, y),
                                          global_batch_size=8 // REPLICAS)

    def spanning(self, share, reduction):
        """The gradients of a tape around strategy.run reducing `share`
        with `reduction`."""
        with tf.GradientTape() as tape:
            loss = self.strategy.reduce(
                reduction, self.strategy.run(share, args=(self.x, self.y)), axis=None)
        return tape.gradient(loss, self.model.trainable_variables)

    def apply(self, gradients, **options):
        self.optimizer.apply_gradients(zip(gradients, self.model.trainable_variables),
                                       **options)

    def weights(self):
        return [w.numpy() for w in self.model.weights]


def one_device_gradients(keras):
    """The gradients of the mean squared error over the global batch."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.set_weights([np.full((3, 1), 0.5, np.float32), np.zeros(1, np.float32)])
    with tf.GradientTape() as tape:
        error = model(FEATURES) - LABELS
        loss = tf.reduce_mean(tf.reduce_sum(error * error, axis=1))
    return [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]


def run(program, mode, recorded=True):
    """Runs `program` (a function of no arguments), eagerly or as a
    tf.function, with a recorder and compute_average_loss observed as the
    run command has them (unless not `recorded`); returns (its result, the
    warnings as (kind, count))."""
    function = tf.function(program) if mode == "tf_function" else program
    with Recording() as recorder, (scale_traps.observe_average_losses() if recorded
                                   else contextlib.nullcontext()):
        result = function()
    return result, [(w["kind"], w["count"]) for w in recorder.snapshot()["warnings"]]


@pytest.fixture(params=KERAS_MODULES)
def keras_name(request):
    return request.param


@pytest.fixture(params=["eager", "tf_function"])
def mode(request):
    return request.param


def scoped(program, strategy):
    """`program` called inside strategy.scope()."""
    def call():
        with strategy.scope():
            return program()
    return call


@pytest.mark.parametrize("reduction, share, expected_scale, warned", [
    ("SUM", "average_loss", 1.0, False),     # the tutorial's
    ("MEAN", "mean_loss", 1.0, False),       # per-replica means
    ("MEAN", "average_loss", 1.0 / REPLICAS, True),   # the trap: 1/N
    ("SUM", "mean_loss", float(REPLICAS), False),     # N times, not told apart
])
def test_a_mean_of_compute_average_loss_is_warned_about(
        strategy, configuration, keras_name, mode, reduction, share,
        expected_scale, warned):
    program = Program(strategy, keras_name)

    def gradients():
        return program.spanning(getattr(program, share), reduction)

    if configuration not in PATCHED_CONFIGURATIONS:
        with pytest.raises(ValueError, match="handle is not available"):
            run(scoped(gradients, strategy), mode, recorded=False)
        return
    found, warnings = run(scoped(gradients, strategy), mode)
    expected = one_device_gradients(program.keras)
    for gradient, one_device in zip(found, expected):
        np.testing.assert_allclose(gradient.numpy(), one_device * expected_scale,
                                   rtol=1e-5)
    assert warnings == ([(scale_traps.MEAN_OF_AVERAGE_LOSSES, 1)] if warned else [])


def test_without_the_observation_the_trap_goes_unseen(strategy, keras_name):
    """The control: compute_average_loss not observed, nothing to warn of."""
    program = Program(strategy, keras_name)
    _, warnings = run(scoped(lambda: program.spanning(program.average_loss, "MEAN"),
                             strategy), "eager", recorded=False)
    assert warnings == []


def test_the_observation_restores_tensorflows_function():
    original = tf.nn.compute_average_loss
    with scale_traps.observe_average_losses():
        assert tf.nn.compute_average_loss is not original
        assert tf.compat.v2.nn.compute_average_loss is tf.nn.compute_average_loss
    assert tf.nn.compute_average_loss is original
    assert tf.compat.v2.nn.compute_average_loss is original


def test_a_total_applied_in_cross_replica_context_is_not_warned_about(
        strategy, configuration, keras_name, mode):
    if configuration not in PATCHED_CONFIGURATIONS:
        return  # stock cannot take the total (the test above)
    program = Program(strategy, keras_name)
    before = program.weights()

    def step():
        gradients = program.spanning(program.average_loss, "SUM")
        program.apply(gradients)
        return gradients

    gradients, warnings = run(scoped(step, strategy), mode)
    for old, new, gradient in zip(before, program.weights(), gradients):
        np.testing.assert_allclose(new, old - 0.1 * gradient.numpy(), rtol=1e-5, atol=1e-7)
    assert warnings == []


@pytest.mark.skipif(not is_keras3(tf.keras), reason="Keras 3's optimizers")
def test_a_mean_of_per_replica_means_by_compute_average_loss_is_not_warned_about(
        strategy, configuration, keras_name):
    """compute_average_loss told the replica's own batch size (eagerly, where
    the batch size is static) makes a per-replica mean: its MEAN is right."""
    if configuration not in PATCHED_CONFIGURATIONS:
        return  # stock cannot take the total (the test above)
    program = Program(strategy, keras_name)
    found, warnings = run(scoped(lambda: program.spanning(
        program.local_average_loss, "MEAN"), strategy), "eager")
    for gradient, one_device in zip(found, one_device_gradients(program.keras)):
        np.testing.assert_allclose(gradient.numpy(), one_device, rtol=1e-5)
    assert warnings == []


@pytest.mark.skipif(not is_keras3(tf.keras), reason="Keras 3's optimizers (apply)")
@pytest.mark.parametrize("scaled", [False, True])
def test_a_total_applied_inside_strategy_run_is_refused(strategy, configuration, scaled, mode):
    """A total handed to an optimizer inside strategy.run would be added up
    once per replica (measured before the refusal: 4 times with Keras 3's
    LossScaleOptimizer eagerly, 2 times on 2 workers with its SGD eagerly,
    2 times in a tf.function): refused, with the weights untouched (also
    what was computed from it in a tf.function: an unscale). Stock cannot
    take the total (the test above)."""
    if configuration not in PATCHED_CONFIGURATIONS:
        return
    program = Program(strategy, "tf.keras")
    if scaled:
        with strategy.scope():
            program.optimizer = tf.keras.optimizers.LossScaleOptimizer(
                tf.keras.optimizers.SGD(0.1), initial_scale=1.0)
            program.optimizer.build(program.model.trainable_variables)
    before = program.weights()

    def step():
        gradients = program.spanning(program.average_loss, "SUM")
        strategy.run(lambda g: program.optimizer.apply(
            g, program.model.trainable_variables), args=(gradients,))

    with pytest.raises(ValueError, match="tfdtape: cannot all-reduce a total over the "
                       "replicas again") as raised:
        run(scoped(step, strategy), mode)
    assert "call optimizer.apply_gradients outside strategy.run" in str(raised.value)
    for old, new in zip(before, program.weights()):
        np.testing.assert_array_equal(new, old)


def test_the_tutorial_loop_is_not_warned_about(strategy, keras_name, mode):
    program = Program(strategy, keras_name)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = program.average_loss(x, y)
        program.apply(tape.gradient(loss, program.model.trainable_variables))

    _, warnings = run(lambda: strategy.run(replica_step, args=(program.x, program.y)),
                      mode)
    assert warnings == []


@pytest.mark.skipif(not is_keras3(tf.keras), reason="Keras 3's LossScaleOptimizer")
def test_the_run_report_names_both_traps_and_nothing_else(tmp_path):
    script = shutil.copy(SCRIPTS / "scale_traps.py", tmp_path)
    completed = tfdtape_run("--json", str(tmp_path / "r.json"), "scale_traps.py",
                            cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout == "trained\n"
    report = json.loads((tmp_path / "r.json").read_text())
    located = [(w["kind"], w["location"], w["count"]) for w in report["warnings"]]
    assert located == [
        (scale_traps.MEAN_OF_AVERAGE_LOSSES,
         f"{script}:{script_line('scale_traps.py', '# REDUCE')}", 1)]
    summary = summary_of(completed.stderr)
    assert "Warnings: 1" in summary.splitlines()
    assert "Reduce them with SUM" in " ".join(summary.split())
