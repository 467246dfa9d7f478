"""Packages imported after tfdtape installed (tfdtape.late_imports): their
targets are patched right after their import, in a fresh process."""

import ast
import os
import subprocess
import sys
import types

import pytest

pytestmark = pytest.mark.per_release

LATE_TF_KERAS = """
import sys
import tfdtape
from tfdtape import keras2_aggregation, keras2_loss_scaling, targets
assert "tf_keras" not in sys.modules
{before}
import tf_keras
def holders():
    return [t.holder() for t in targets.patch_targets() if t.attribute in (
        keras2_aggregation.ATTRIBUTE, keras2_loss_scaling.ATTRIBUTE)]
print(holders(), tfdtape.is_installed())
tfdtape.uninstall()
print(holders())
"""


@pytest.mark.parametrize("before, expected", [
    ("", "['tfdtape', 'tfdtape', 'tfdtape'] True"),
    ("tfdtape.uninstall()", "['tensorflow', 'tensorflow', 'tensorflow'] False"),
])
def test_tf_keras_imported_after_tfdtape_is_patched_while_installed(before, expected):
    """tf_keras is imported after tfdtape: its optimizer and its two loss
    scale optimizers are patched right after their import while tfdtape is
    installed (tfdtape.late_imports), not while it is not; uninstall
    restores Keras's functions."""
    pytest.importorskip("tf_keras", reason="tf_keras is not installed")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    completed = subprocess.run(
        [sys.executable, "-c", LATE_TF_KERAS.format(before=before)], env=env,
        capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.splitlines()[-2:] == [
        expected, "['tensorflow', 'tensorflow', 'tensorflow']"]


KERAS_FIRST = """
import {package}
import tensorflow as tf
from tfdtape import targets
print(sorted(t.holder() for t in targets.patch_targets()
             if getattr(t.owner, "__module__", "").startswith("{package}.")))
"""


@pytest.mark.parametrize("package", ["tf_keras", "keras"])
def test_a_script_importing_keras_before_tensorflow_under_run_is_patched(
        package, tmp_path):
    """Found by the review: under `python -m tfdtape run`, tfdtape installs
    when TensorFlow's import ends, inside the Keras package's own import,
    before its optimizer modules load; they are patched when they have
    loaded (they were left as Keras's, and the cross-replica apply
    raised)."""
    pytest.importorskip(package, reason=f"{package} is not installed")
    script = tmp_path / "script.py"
    script.write_text(KERAS_FIRST.format(package=package))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    completed = subprocess.run(
        [sys.executable, "-m", "tfdtape", "run", str(script)],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    holders = ast.literal_eval(completed.stdout.splitlines()[0])
    assert holders and set(holders) == {"tfdtape"}


@pytest.mark.parametrize("name", ["TensorFlowTrainer", "Trainer"])
def test_keras_trainer_is_found_under_either_name(monkeypatch, name):
    """Keras 3.15 calls its TensorFlow trainer TensorFlowTrainer, keras-nightly
    3.16 Trainer: the multi-worker patch finds it under both."""
    from tfdtape import keras3_multi_worker
    module = types.ModuleType(keras3_multi_worker.DEFINING_MODULE)
    trainer = type(name, (), {"_maybe_symbolic_build": lambda self: None})
    setattr(module, name, trainer)
    monkeypatch.setitem(sys.modules, keras3_multi_worker.DEFINING_MODULE, module)
    assert keras3_multi_worker.trainer_class() is trainer
    setattr(module, name, type(name, (), {}))  # not the trainer: no build method
    assert keras3_multi_worker.trainer_class() is None
