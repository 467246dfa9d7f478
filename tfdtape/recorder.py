"""What happened to gradient tapes in a run, counted: the recorder behind
`python -m tfdtape run`.

A `Recorder` is a sink of `tfdtape.tracing`: it receives every watch
decision and every `GradientTape.gradient` call, and keeps only counts keyed
by names and small strings — never a tensor or variable — so its size grows
with the number of distinct variables and call sites, not with steps.
`snapshot()` gives everything it counted as plain data, which
`tfdtape.run_report` turns into the summary and the JSON report.
"""

import collections
import threading

from tfdtape import keras_variables
from tfdtape import resolution
from tfdtape import tracing

CONTAINER = "container"
"""Watched as its distributed container (replica context)."""
COMPONENTS = "components"
"""A distributed variable watched as its local components (cross-replica)."""
COMPONENT = "component"
"""A component of a distributed variable watched as itself."""
PLAIN = "plain"
"""A variable that belongs to no distributed container, watched as itself."""


class Recorder:
    """Counts watch decisions, None gradients and total derivatives."""

    records_untaped = False
    """Reads while no tape records are no tape's business: not sent here."""

    def __init__(self):
        self.complete = True  # False once tfdtape is uninstalled meanwhile.
        self._lock = threading.Lock()
        self._watches = collections.Counter()
        self._none_gradients = collections.Counter()
        self._messages = {}
        self._totals = collections.Counter()

    def add_event(self, event):
        """Counts one tracing.WatchEvent under (variable, how, kind, context,
        replica, strategy); a read while no tape recorded is no tape's."""
        if not event.taped:
            return
        how, variable = _how(event.variable, event.resolved)
        key = (keras_variables.label(variable), how, event.kind, event.context,
               event.replica_id, event.strategy)
        with self._lock:
            self._watches[key] += 1

    def add_gradient(self, event):
        """Counts the None gradients and total derivatives of one
        tracing.GradientEvent, by source and call site."""
        with self._lock:
            for source, reason, message in event.none_reasons:
                key = (keras_variables.label(source), reason, event.location,
                       event.context)
                self._none_gradients[key] += 1
                self._messages[key] = message
            for source, components in event.totals:
                key = (keras_variables.label(source), components, event.location)
                self._totals[key] += 1

    def snapshot(self):
        """Everything counted so far, as JSON-ready lists of dicts."""
        with self._lock:
            watched = [
                {"variable": variable, "how": how, "kind": kind,
                 "context": context, "replica": replica, "strategy": strategy,
                 "count": count}
                for (variable, how, kind, context, replica, strategy), count
                in sorted(self._watches.items(), key=_sort_key)]
            none_gradients = [
                {"source": source, "reason": reason, "location": location,
                 "context": context, "message": self._messages[key],
                 "count": count}
                for key, count in sorted(self._none_gradients.items())
                for source, reason, location, context in [key]]
            totals = [
                {"source": source, "components": components,
                 "location": location, "count": count}
                for (source, components, location), count
                in sorted(self._totals.items())]
        return {"complete": self.complete, "watched": watched,
                "none_gradients": none_gradients, "total_derivatives": totals}


def incomplete_reason(snapshot):
    """Why the recording a `Recorder.snapshot()` holds is incomplete (tfdtape
    was uninstalled while it recorded), or None: what `run_report.build`
    takes with that snapshot."""
    return None if snapshot["complete"] else tracing.INCOMPLETE_NOTE


def _how(variable, resolved):
    """(how, the variable to name): how the tape watched `variable`."""
    if len(resolved) == 1 and resolution.is_distributed_variable(resolved[0]):
        return CONTAINER, resolved[0]
    if resolution.is_distributed_variable(
            keras_variables.unwrap(variable, "tfdtape run")):
        return COMPONENTS, variable
    if resolution.container_of(resolved[0]) is not None:
        return COMPONENT, resolved[0]
    return PLAIN, variable


def _sort_key(item):
    (variable, how, kind, context, replica, strategy), _ = item
    return (variable, how, kind, context, -1 if replica is None else replica,
            strategy)
