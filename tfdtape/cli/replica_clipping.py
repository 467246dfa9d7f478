"""A Keras 3 optimizer that clips gradients inside the replicas, noticed for
`python -m tfdtape run`'s report.

Keras 3 clips (`clipnorm`, `global_clipnorm`, `clipvalue`) in `apply`,
before its update all-reduces the gradients; applied inside `strategy.run`
(TensorFlow's tutorial step, `model.fit`) under a strategy of several
replicas, each replica's share of the gradient is clipped on its own, and
once a share is clipped the step differs from one device on the global
batch (warned whether or not a clip happened) (tensorflow#33929,
horovod#1346). Clipping in cross-replica context (a tape around
`strategy.run` applied outside it, or Keras 3's accumulation under tfdtape)
clips the totals, as one device does. tf_keras optimizers all-reduce before
they clip and are not concerned.

Inside `observe_replica_clipping()` (the run command's lifetime), Keras 3's
`BaseOptimizer._clip_gradients` is a scoped patch (through
`targets.scoped`, put in when Keras's optimizer module is loaded, now or
later): while a sink is open, the first clip of each optimizer with a clip
option set in replica context under a strategy of several replicas is
reported as an `events.WarningEvent` naming the optimizer and its option.
"""

import contextlib
import functools
import sys
import weakref

from tensorflow.python.distribute import distribute_lib

from tfdtape import events
from tfdtape import import_hook
from tfdtape import keras3_accumulation
from tfdtape import targets

CLIPPING_IN_REPLICAS = "clipping inside the replicas"
"""The warning kind this module reports."""

ATTRIBUTE = "_clip_gradients"
PARAMETERS = ("self", "grads")
CLIP_OPTIONS = ("clipnorm", "global_clipnorm", "clipvalue")

# The optimizers reported so far (once each), without keeping them alive.
_reported = weakref.WeakSet()


def clip_option(optimizer):
    """'global_clipnorm=1.0' for the clip option `optimizer` has set (Keras
    allows one), or None."""
    for option in CLIP_OPTIONS:
        value = getattr(optimizer, option, None)
        if value:
            return f"{option}={value}"
    return None


def _clips_a_share(optimizer):
    """Whether a clip by `optimizer` now clips one replica's share."""
    if clip_option(optimizer) is None:
        return False
    if distribute_lib.in_cross_replica_context() or not distribute_lib.has_strategy():
        return False
    return distribute_lib.get_strategy().num_replicas_in_sync > 1


def _observe_clipping(original):
    """`_clip_gradients` reporting the first clip of each optimizer inside
    the replicas while a sink is open."""

    @functools.wraps(original)
    def _clip_gradients(self, grads):
        if events.active and self not in _reported and _clips_a_share(self):
            _reported.add(self)
            subject = f"{type(self).__name__} {self.name!r} ({clip_option(self)})"
            events.warn(CLIPPING_IN_REPLICAS, sys._getframe(1), subject=subject)
        return original(self, grads)

    return _clip_gradients


def clipping_targets():
    """The target of Keras 3's `_clip_gradients` where Keras 3 is loaded
    and defines it on the class that defines `_backend_apply_gradients`;
    else none."""
    cls = keras3_accumulation.keras_class()
    if cls is None or ATTRIBUTE not in vars(cls):
        return []
    return [targets.PatchTarget(cls, ATTRIBUTE, PARAMETERS, _observe_clipping,
                                required=False)]


@contextlib.contextmanager
def observe_replica_clipping():
    """Inside the block, Keras 3's optimizers report their first clip inside
    the replicas (put in when Keras's optimizer module is loaded, if it is
    not yet)."""
    with contextlib.ExitStack() as stack:
        def keras_arrived():
            stack.enter_context(targets.scoped(clipping_targets()))

        watch = import_hook.AfterImport(keras3_accumulation.DEFINING_MODULE,
                                        keras_arrived, defer_prefix="\0")
        stack.callback(watch.stop)
        watch.start()
        yield
