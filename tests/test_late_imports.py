"""Packages imported after tfdtape installed (tfdtape.late_imports): their
targets are patched right after their import, in a fresh process."""

import os
import subprocess
import sys

import pytest

LATE_TF_KERAS = """
import sys
import tfdtape
from tfdtape import keras2_aggregation, targets
assert "tf_keras" not in sys.modules
{before}
import tf_keras
holders = [t.holder() for t in targets.patch_targets()
           if t.attribute == keras2_aggregation.ATTRIBUTE]
print(holders, tfdtape.is_installed())
tfdtape.uninstall()
print([t.holder() for t in targets.patch_targets()
       if t.attribute == keras2_aggregation.ATTRIBUTE])
"""


@pytest.mark.parametrize("before, expected", [
    ("", "['tfdtape'] True"),
    ("tfdtape.uninstall()", "['tensorflow'] False"),
])
def test_tf_keras_imported_after_tfdtape_is_patched_while_installed(before, expected):
    """tf_keras is imported after tfdtape: its optimizer is patched right
    after its import while tfdtape is installed (tfdtape.late_imports), not
    while it is not; uninstall restores Keras's function."""
    pytest.importorskip("tf_keras", reason="tf_keras is not installed")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    completed = subprocess.run(
        [sys.executable, "-c", LATE_TF_KERAS.format(before=before)], env=env,
        capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.splitlines()[-2:] == [expected, "['tensorflow']"]
