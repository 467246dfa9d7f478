"""Clipping inside the replicas (tfdtape.cli.replica_clipping): a Keras 3
optimizer with a clip option applied inside strategy.run under several
replicas clips each replica's share before the all-reduce, so once a share
is clipped the step differs from one device; the run report says so once
per optimizer, naming it and its option, and says nothing where the clip
is the one device's (the tape around strategy.run, accumulation under
tfdtape, one replica, no clip option).

In-process with a recorder (as `python -m tfdtape run` has one) on
MirroredStrategy(4) in every configuration (the warning is also
`--no-install`'s), eagerly and in a tf.function; once end to end, with Keras
loaded after the run began.
"""

import json
import shutil

import numpy as np
import pytest
import tensorflow as tf

from keras_models import is_keras3
from run_helpers import SCRIPTS
from run_helpers import Recording
from run_helpers import script_line
from run_helpers import summary_of
from run_helpers import tfdtape_run
from tfdtape.cli import replica_clipping
from tfdtape.testing import PATCHED_CONFIGURATIONS

pytestmark = [
    pytest.mark.per_release,
    pytest.mark.skipif(not is_keras3(tf.keras), reason="Keras 3's optimizers clip "
                       "inside the replicas (tf_keras all-reduces first)")]

BATCH = 8
RNG = np.random.default_rng(3)
FEATURES = RNG.normal(size=(BATCH, 3)).astype(np.float32)
LABELS = RNG.normal(size=(BATCH, 1)).astype(np.float32) * 4.0
STEPS = 3
APPLY_LINE = next(number for number, line in enumerate(open(__file__), start=1)
                  if "# APPLY IN" + " REPLICA" in line)
CLIPS = {"global_clipnorm": 0.05, "clipnorm": 0.05, "clipvalue": 0.01}


def build(clip, accumulate=None):
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
    model.set_weights([np.full((3, 1), 0.5, np.float32), np.zeros(1, np.float32)])
    options = {clip: CLIPS[clip]} if clip else {}
    if accumulate:
        options["gradient_accumulation_steps"] = accumulate
    return model, tf.keras.optimizers.SGD(0.1, name="clipped", **options)


def one_device(clip, accumulate=None):
    model, optimizer = build(clip, accumulate)
    for _ in range(STEPS):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(FEATURES) - LABELS) ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables))
    return [w.numpy() for w in model.weights]


def train(strategy, style, mode, clip, accumulate=None):
    """Trains STEPS steps in `style` (tutorial: tape and apply inside
    strategy.run; spanning: tape around it, apply outside) with a recorder
    and the observation; returns (every copy of every weight, the warnings)."""
    with strategy.scope():
        model, optimizer = build(clip, accumulate)
        # Built before the step: variables a traced strategy.run creates on its
        # first call fail on stock ("You must feed a value for placeholder").
        optimizer.build(model.trainable_variables)
    x, y = next(iter(strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((FEATURES, LABELS)).batch(BATCH))))

    def share(x, y):
        return tf.reduce_sum((model(x) - y) ** 2) / BATCH

    def tutorial():
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = share(x, y)
            optimizer.apply_gradients(zip(  # APPLY IN REPLICA
                tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        strategy.run(replica, args=(x, y))

    def spanning():
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", strategy.run(share, args=(x, y)), axis=None)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables))

    step = tutorial if style == "tutorial" else spanning
    step = tf.function(step) if mode == "tf_function" else step
    with Recording() as recorder, replica_clipping.observe_replica_clipping():
        with strategy.scope():
            for _ in range(STEPS):
                step()
    copies = [[c.numpy() for c in w.value.values] for w in model.weights]
    return copies, recorder.snapshot()["warnings"]


def assert_weights(copies, expected):
    for components, reference in zip(copies, expected):
        for component in components:
            np.testing.assert_allclose(component, reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("clip", sorted(CLIPS))
@pytest.mark.parametrize("mode", ["eager", "tf_function"])
def test_clipping_in_the_tutorial_step_is_warned_about_once(strategy, configuration,
                                                            mode, clip):
    copies, warnings = train(strategy, "tutorial", mode, clip)
    assert [(w["kind"], w["subject"], w["count"]) for w in warnings] == [
        (replica_clipping.CLIPPING_IN_REPLICAS, f"SGD 'clipped' ({clip}={CLIPS[clip]})", 1)]
    assert warnings[0]["location"] == f"{__file__}:{APPLY_LINE}"
    # What it warns of: the step is not one device's (each share clipped).
    differs = [not np.allclose(c[0], r, rtol=1e-4, atol=1e-6)
               for c, r in zip(copies, one_device(clip))]
    assert any(differs)


@pytest.mark.parametrize("mode", ["eager", "tf_function"])
def test_no_clip_option_no_warning(strategy, configuration, mode):
    copies, warnings = train(strategy, "tutorial", mode, None)
    assert warnings == []
    assert_weights(copies, one_device(None))


@pytest.mark.parametrize("mode", ["eager", "tf_function"])
def test_clipping_the_totals_is_not_warned_about(strategy, configuration, mode):
    """The tape around strategy.run, applied in cross-replica context: the
    clip of the totals, as one device's (stock cannot run it: the handle
    error)."""
    if configuration not in PATCHED_CONFIGURATIONS:
        with pytest.raises(ValueError, match="handle is not available"):
            train(strategy, "spanning", mode, "global_clipnorm")
        return
    copies, warnings = train(strategy, "spanning", mode, "global_clipnorm")
    assert warnings == []
    assert_weights(copies, one_device("global_clipnorm"))


@pytest.mark.parametrize("mode", ["eager", "tf_function"])
def test_accumulation_with_tfdtape_clips_the_totals(strategy, configuration, mode):
    """Keras 3's accumulation under tfdtape clips in cross-replica context:
    the one device's step, no warning; stock clips each share."""
    if configuration not in PATCHED_CONFIGURATIONS:
        if mode == "tf_function":
            return  # stock fails in Keras's cond (test_keras_accumulation.py)
        copies, warnings = train(strategy, "tutorial", mode, "global_clipnorm", 2)
        assert [w["kind"] for w in warnings] == [replica_clipping.CLIPPING_IN_REPLICAS]
        return
    copies, warnings = train(strategy, "tutorial", mode, "global_clipnorm", 2)
    assert warnings == []
    assert_weights(copies, one_device("global_clipnorm", 2))


def test_one_replica_is_one_device(configuration):
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model, optimizer = build("global_clipnorm")
    with Recording() as recorder, replica_clipping.observe_replica_clipping():
        strategy.run(lambda: optimizer.apply_gradients(
            [(tf.ones((3, 1)), model.weights[0])]))
    assert recorder.snapshot()["warnings"] == []


def test_without_the_observation_nothing_is_seen(strategy):
    """The control: the recorder alone does not see clipping."""
    with strategy.scope():
        model, optimizer = build("clipnorm")
    with Recording() as recorder:
        strategy.run(lambda: optimizer.apply_gradients(
            [(tf.ones((3, 1)), model.weights[0])]))
    assert recorder.snapshot()["warnings"] == []


def test_the_observation_restores_keras_function():
    (target,) = replica_clipping.clipping_targets()
    original = target.current()
    with replica_clipping.observe_replica_clipping():
        assert target.current() is not original
        assert target.holder() == "tfdtape-scoped"
    assert target.current() is original


def test_the_run_report_names_the_optimizer_of_fit_and_of_the_tutorial_step(tmp_path):
    """End to end: Keras is loaded after the run began; fit's clip has no
    line of the script (its replica threads), the tutorial step's has."""
    script = shutil.copy(SCRIPTS / "replica_clipping.py", tmp_path)
    completed = tfdtape_run("--json", str(tmp_path / "r.json"), "replica_clipping.py",
                            cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert [(w["kind"], w["subject"], w["location"], w["count"])
            for w in report["warnings"]] == [
        (replica_clipping.CLIPPING_IN_REPLICAS, "SGD 'sgd' (global_clipnorm=0.5)",
         f"{script}:{script_line('replica_clipping.py', '# APPLY')}", 1),
        (replica_clipping.CLIPPING_IN_REPLICAS, "Adam 'adam' (clipvalue=0.5)", "?", 1)]
    summary = " ".join(summary_of(completed.stderr).split())
    assert "Warnings: 2" in summary
    assert "SGD 'sgd' (global_clipnorm=0.5): first at replica_clipping.py:" in summary
    assert "or all-reduce first and clip the totals" in summary
