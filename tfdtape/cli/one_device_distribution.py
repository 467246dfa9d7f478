"""A Keras 3 distribution that trains on one device, noticed for `python -m
tfdtape run --no-install`'s report.

On the TensorFlow backend Keras accepts `keras.distribution.set_distribution
(DataParallel(...))` and ignores it: without tfdtape, models train on one
device with plain variables (`tfdtape.keras3_distribution` maps it onto
tf.distribute when tfdtape is installed). Inside
`observe_one_device_distributions()` (the --no-install run's lifetime),
Keras's TensorFlow trainer's `_maybe_symbolic_build`, which `fit`,
`evaluate` and `predict` call first, is a scoped patch (through
`targets.scoped`, put in when the trainer module is loaded, now or later):
while a sink is open, the first model that trains with no strategy while a
Keras distribution is set is reported, once per run, as an
`events.WarningEvent` naming the distribution and the model.
"""

import contextlib
import functools
import sys

from tensorflow.python.distribute import distribute_lib

from tfdtape import events
from tfdtape import import_hook
from tfdtape import keras3_distribution
from tfdtape import keras3_multi_worker
from tfdtape import targets

ONE_DEVICE_DISTRIBUTION = "Keras distribution on one device"
"""The warning kind this module reports."""

_reported = []
"""True once the warning of the run (the block) is sent."""


def _distribution():
    """The Keras distribution set now, or None."""
    module = keras3_distribution.defining_module()
    return None if module is None else module.distribution()


def _observe_build(original):
    """`_maybe_symbolic_build` reporting the first model that trains on one
    device while a Keras distribution is set."""

    @functools.wraps(original)
    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if events.active and not _reported:
            distribution = _distribution()
            if (distribution is not None and self._distribute_strategy is None
                    and not distribute_lib.has_strategy()):
                _reported.append(True)
                devices = distribution.device_mesh.devices.size
                events.warn(ONE_DEVICE_DISTRIBUTION, sys._getframe(1), subject=(
                    f"{type(distribution).__name__} over {devices} devices set, "
                    f"model {self.name!r} trained on one device"))
        return original(self, iterator=iterator, data_batch=data_batch)

    return _maybe_symbolic_build


def build_targets():
    """The target of Keras 3's trainer's `_maybe_symbolic_build`, where the
    trainer is loaded; else none."""
    cls = keras3_multi_worker.trainer_class()
    if cls is None:
        return []
    return [targets.PatchTarget(cls, keras3_multi_worker.BUILD_ATTRIBUTE,
                                keras3_multi_worker.BUILD_PARAMETERS, _observe_build,
                                required=False)]


@contextlib.contextmanager
def observe_one_device_distributions():
    """Inside the block, the first model trained on one device while a
    Keras distribution is set is reported (the trainer's patch put in when
    Keras's trainer module is loaded, if it is not yet)."""
    _reported.clear()
    with contextlib.ExitStack() as stack:
        def trainer_arrived():
            stack.enter_context(targets.scoped(build_targets()))

        watch = import_hook.AfterImport(keras3_multi_worker.DEFINING_MODULE,
                                        trainer_arrived, defer_prefix="\0")
        stack.callback(watch.stop)
        watch.start()
        yield
