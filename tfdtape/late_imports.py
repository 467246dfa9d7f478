"""Patch targets in packages imported after tfdtape installed.

tf_keras (Keras 2 for TensorFlow 2.16 and later) is not imported with
TensorFlow; a program imports it, usually after `import tfdtape`. Its
optimizer is a patch target (`tfdtape.keras2_aggregation`), so tfdtape
watches for its import (`tfdtape.import_hook`) and, right after the
package's `__init__` has run, patches the new targets if tfdtape is
installed then. Keras 3 needs no watch: TensorFlow 2.16+ imports its
optimizers with TensorFlow itself.
"""

import sys

from tfdtape import import_hook

PACKAGES = ("tf_keras",)
"""The packages watched for."""

# Kept across importlib.reload: a watch started stays the only one.
_watches = globals().get("_watches") or {}


def watch(arrived):
    """Starts, once per process and package, a watch that calls `arrived()`
    right after each package of PACKAGES not yet imported is imported."""
    for package in PACKAGES:
        if package in sys.modules or package in _watches:
            continue
        # No deferring prefix: what `arrived` needs of tfdtape is loaded.
        _watches[package] = import_hook.AfterImport(package, arrived, defer_prefix="\0")
        _watches[package].start()
