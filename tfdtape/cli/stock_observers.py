"""Watching stock TensorFlow without changing it: `python -m tfdtape run
--no-install`.

`observe_stock()` wraps TensorFlow's own tape functions and
`GradientTape.gradient` with observers that call them unchanged and then
report what they did to `tfdtape.events`, so a recorder sees what stock
TensorFlow watches — for comparison with a run where tfdtape is installed.
The observers are for a process that ends with the run: they are put in
place once, as a `targets.scoped()` block, and taken out when it exits.
"""

import contextlib
import functools
import sys

from tensorflow.python.eager import backprop
from tensorflow.python.eager import tape as tape_module
from tensorflow.python.util import nest

from tfdtape import call_sites
from tfdtape import compat
from tfdtape import events
from tfdtape import targets


def stock_resolution(variable):
    """What stock TensorFlow's tape watches for `variable` here."""
    override = vars(tape_module).get("_variables_override")
    if override is not None:  # TensorFlow 2.13+: the registered resolver.
        return tuple(override(variable))
    strategy, replica_context = (  # 2.12: the same rule, inline.
        compat.strategy_context.get_strategy_and_replica_context())
    if replica_context is None:
        return tuple(strategy.experimental_local_results(variable))
    return (strategy.extended.value_container(variable),)


def _observe_watch_variable(original):
    @functools.wraps(original)
    def watch_variable(tape, variable):
        original(tape, variable)
        if events.active:
            events.record("watch", variable, stock_resolution(variable))
    return watch_variable


def _observe_variable_accessed(original):
    @functools.wraps(original)
    def variable_accessed(variable):
        original(variable)
        if events.active:
            events.record("access", variable, stock_resolution(variable))
    return variable_accessed


def _observe_variables_accessed(original):
    @functools.wraps(original)
    def variables_accessed(variables):
        original(variables)
        if events.active:
            for variable in variables:
                if variable.trainable:
                    events.record("access", variable,
                                   stock_resolution(variable))
    return variables_accessed


def _observe_gradient(original):
    @functools.wraps(original)
    def gradient(self, target, sources, *args, **kwargs):
        recorded = self._tape
        result = original(self, target, sources, *args, **kwargs)
        if events.active:
            events.record_gradient(events.GradientEvent(
                self, recorded, tuple(nest.flatten(sources)),
                tuple(nest.flatten(result)), False, (),
                call_sites.caller_location(sys._getframe(1)), events.context_now()))
        return result
    return gradient


def observer_targets():
    """The targets `observe_stock()` holds: TensorFlow's tape functions and
    `GradientTape.gradient`, each with its observer."""
    return [
        targets.PatchTarget(tape_module, "watch_variable", ("tape", "variable"),
                            _observe_watch_variable),
        targets.PatchTarget(tape_module, "variable_accessed", ("variable",),
                            _observe_variable_accessed),
        targets.PatchTarget(tape_module, "variables_accessed", ("variables",),
                            _observe_variables_accessed, required=False),
        targets.PatchTarget(backprop.GradientTape, "gradient",
                            ("self", "target", "sources", "output_gradients",
                             "unconnected_gradients"), _observe_gradient),
    ]


@contextlib.contextmanager
def observe_stock():
    """Observes TensorFlow's own tape functions inside the block (through
    `targets.scoped`: `info` names them, `uninstall()` restores them)."""
    with targets.scoped(observer_targets()):
        events.observing_stock = True
        try:
            yield
        finally:
            events.observing_stock = False
