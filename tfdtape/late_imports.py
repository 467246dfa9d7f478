"""Patch targets in modules imported after tfdtape installed.

tf_keras (Keras 2 for TensorFlow 2.16 and later) is not imported with
TensorFlow; a program imports it, usually after `import tfdtape`. And a
package that imports TensorFlow itself (tf_keras, Keras 3) before the
program does is half imported when tfdtape installs at TensorFlow's
import (`python -m tfdtape run`): its optimizer modules load after. The
modules that define patch targets (`MODULES`) are therefore watched for
(`tfdtape.import_hook`): right after one has loaded, the new targets are
patched if tfdtape is installed then.
"""

import sys

from tfdtape import import_hook
from tfdtape import keras2_aggregation
from tfdtape import keras2_loss_scaling
from tfdtape import keras3_accumulation
from tfdtape import keras3_distribution
from tfdtape import keras3_loss_scaling
from tfdtape import keras3_multi_worker
from tfdtape import keras3_saving
from tfdtape import process_state

MODULES = (*keras2_aggregation.OPTIMIZER_MODULES,
           *keras2_loss_scaling.DEFINING_MODULES, keras3_loss_scaling.DEFINING_MODULE,
           keras3_accumulation.DEFINING_MODULE, keras3_multi_worker.DEFINING_MODULE,
           *keras3_distribution.API_MODULES, keras3_distribution.ADAPTER_MODULE,
           *keras3_saving.WATCHED)
"""The modules watched for."""

# Kept across importlib.reload: a watch started stays the only one.
_watches = process_state.kept(globals(), "_watches", dict)


def watch(arrived):
    """Starts, once per process and module, a watch that calls `arrived()`
    right after each module of MODULES not yet loaded is loaded."""
    for name in MODULES:
        if name in sys.modules or name in _watches:
            continue
        # No deferring prefix: what `arrived` needs of tfdtape is loaded.
        _watches[name] = import_hook.AfterImport(name, arrived, defer_prefix="\0")
        _watches[name].start()
