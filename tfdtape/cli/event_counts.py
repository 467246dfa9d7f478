"""What happened to gradient tapes in a run, counted: the recorder behind
`python -m tfdtape run` and the pytest plugin's report.

An `EventCounts` is a sink of `tfdtape.events`: it receives every watch
decision, every `GradientTape.gradient` call and every refusal of tfdtape's.
It counts them per *variable* — the object, not its name, so two variables
that share a name (two Keras layers' `kernel`, a model and its restored copy)
stay apart, and one variable read as a component and named as a Keras
variable is one. It never keeps a tensor or a variable alive: variables are
told apart by weak references, and what it keeps grows with the number of
distinct variables and call sites, not with steps. `snapshot()` gives
everything as plain data, which `tfdtape.cli.run_report` turns into the summary
and the JSON report.

It also notes what deserves a warning: a plain variable read in replica
context under a strategy of several replicas (each replica reads and
updates the same variable), a cross-replica gradient that only one
component took part in (the step ran on one device), and tfdtape's refusals.
"""

import collections
import sys
import weakref

from tensorflow.python.framework import ops
from tensorflow.python.ops import resource_variable_ops
from tensorflow.python.ops import variables

from tfdtape import call_sites
from tfdtape import events
from tfdtape import explaining
from tfdtape import keras_variables
from tfdtape import process_state
from tfdtape import resolution
from tfdtape.cli import mirrored_copies

CONTAINER = "container"
"""Watched as its distributed container (replica context)."""
COMPONENTS = "components"
"""A distributed variable watched as its local components (cross-replica)."""
COMPONENT = "component"
"""A component of a distributed variable watched as itself."""
PLAIN = "plain"
"""A variable that belongs to no distributed container, watched as itself."""

REPLICA_PLAIN = "plain variable in replica context"
COPIES_DIFFER = "mirrored copies differ"
ONE_DEVICE = "cross-replica gradient on one device"
REFUSAL = "refused by tfdtape"
"""The kinds of warning a snapshot lists, in this order, then those of
`tfdtape.cli.scale_traps` and `tfdtape.cli.replica_clipping` (`run_report`
explains each)."""


class _Variable:
    """What the recorder knows of one variable (or, for tensor sources, one
    kind and name of tensor): strings only."""

    __slots__ = ("serial", "tf_name", "keras_path", "type_name", "strategy")

    def __init__(self, serial, value):
        self.serial = serial
        self.tf_name = str(getattr(value, "name", None) or type(value).__name__)
        self.keras_path = None
        self.type_name = type(value).__name__
        owner = getattr(value, "_distribute_strategy", None)
        self.strategy = type(owner).__name__ if owner is not None else None

    @property
    def label(self):
        """The Keras path where one is known, else the TensorFlow name."""
        return self.keras_path or self.tf_name


class _Variables:
    """The variables seen so far, told apart by identity.

    A variable is found again through a weak reference kept under its id();
    a dead reference (the id reused by another object) gives a new entry.
    Tensors (gradient sources that are no variables, new ones each step) are
    grouped by type and name.
    """

    def __init__(self):
        self._by_id = {}
        self._by_label = {}
        self.entries = []

    def entry(self, value):
        """The `_Variable` for `value`, made on first sight."""
        known = self._by_id.get(id(value))
        if known is not None and known[0]() is value:
            return known[1]
        if not isinstance(value, variables.Variable):
            return self._entry_by_label(value)  # a tensor: a new one each step
        made = _Variable(len(self.entries) + 1, value)
        self.entries.append(made)
        self._by_id[id(value)] = (weakref.ref(value), made)
        return made

    def _entry_by_label(self, value):
        """The entry of a tensor source, one per kind and name (an eager
        tensor has no name: its kind alone)."""
        key = (type(value).__name__, keras_variables.label(value))
        made = self._by_label.get(key)
        if made is None:
            made = self._by_label[key] = _Variable(len(self.entries) + 1, value)
            self.entries.append(made)
        return made

    def alive(self):
        """[(entry, variable)] for every variable seen that is still alive,
        in order of first sight."""
        found = [(made, reference()) for reference, made in list(self._by_id.values())]
        return sorted(((made, value) for made, value in found if value is not None),
                      key=lambda pair: pair[0].serial)

    def names(self):
        """{entry: its unique name}: its label; where several variables share
        the label, the label and the type for a variable whose type is its
        own among them (a container beside its first component), else the
        label and ' #k' (k-th of that label and type, in order of first
        sight)."""
        names = {}
        for label, entries in _grouped(self.entries, lambda e: e.label):
            if len(entries) == 1:
                names[entries[0]] = label
                continue
            for type_name, alike in _grouped(entries, lambda e: e.type_name):
                for index, entry in enumerate(alike, start=1):
                    names[entry] = (f"{label} ({type_name})" if len(alike) == 1
                                    else f"{label} #{index}")
        return names


def _grouped(entries, key):
    """[(key, [entries with that key, in order])], keys in order of first sight."""
    groups = collections.OrderedDict()
    for entry in entries:
        groups.setdefault(key(entry), []).append(entry)
    return list(groups.items())


class EventCounts:
    """Counts watch decisions, gradient calls, None gradients, total
    derivatives, and what deserves a warning, per variable."""

    records_untaped = False
    """Reads while no tape records are no tape's business: not sent here."""

    def __init__(self):
        self.complete = True  # False once tfdtape is uninstalled meanwhile.
        self._lock = process_state.lock()
        self._variables = _Variables()
        self._watches = collections.Counter()
        self._gradient_calls = 0
        self._calls_around_runs = 0
        self._none_gradients = collections.Counter()
        self._messages = {}
        self._totals = collections.Counter()
        self._replica_plain = {}  # entry -> [location of the first use, count]
        self._one_device = collections.Counter()  # location -> count, first seen first
        self._refusals = collections.Counter()  # (first line, location) -> count
        self._unlike_one_device = collections.Counter()  # (kind, location, subject) -> count
        self._differing_copies = []  # [(entry, mirrored_copies.Difference)]

    def add_event(self, event):
        """Counts one events.WatchEvent under (variable, how, kind, context,
        replica, strategy); a read while no tape recorded is no tape's."""
        if not event.taped:
            return
        row, how, keras = _row_of(event.variable, event.resolved)
        with self._lock:
            entry = self._entry(row, keras)
            self._watches[(entry, how, event.kind, event.context,
                           event.replica_id, event.strategy)] += 1
            if how == PLAIN and event.context == "replica":
                self._note_replica_plain(entry)

    def add_gradient(self, event):
        """Counts one events.GradientEvent: the call, its None gradients (why
        each is None asked of `tfdtape.explaining` now, while the tape still
        records as it did) and total derivatives by source and call site."""
        none_reasons = explaining.none_reasons(
            event.tape, event.recorded, event.asked, event.gradients, event.summing)
        with self._lock:
            self._gradient_calls += 1
            self._calls_around_runs += event.around_run
            for source in event.sources:
                if keras_variables.is_keras_variable(source):
                    self._source_entry(source)  # names its variable's row
            for source, reason, message in none_reasons:
                key = (self._source_entry(source), reason, event.location,
                       event.context)
                self._none_gradients[key] += 1
                self._messages.setdefault(reason, message)
            for source, components in event.totals:
                key = (self._source_entry(source), components, event.workers,
                       event.location)
                self._totals[key] += 1
            if event.one_device:
                self._one_device[event.location] += 1
            if event.context == "replica":
                for source in event.sources:  # read by the C++ fast path, say
                    _, variable = _keras_and_variable(source)
                    if _is_plain(variable):
                        self._note_replica_plain(self._entry(variable, None),
                                                 event.location)

    def add_refusal(self, event):
        """Counts one events.RefusalEvent (an error tfdtape raised)."""
        with self._lock:
            self._refusals[(event.message, event.location)] += 1

    def add_warning(self, event):
        """Counts one events.WarningEvent (a program training unlike one
        device: `tfdtape.cli.scale_traps`, `tfdtape.cli.replica_clipping`)."""
        with self._lock:
            self._unlike_one_device[(event.kind, event.location, event.subject)] += 1

    def check_copies(self):
        """Compares the copies of every mirrored variable seen that is still
        alive (`tfdtape.cli.mirrored_copies`); those that differ are listed
        among the warnings from then on. A variable that cannot be read (its
        resources already freed) is passed over."""
        with self._lock:
            alive = [(entry, value) for entry, value in self._variables.alive()
                     if mirrored_copies.is_mirrored(value)]
        found = []
        for entry, variable in alive:
            try:
                difference = mirrored_copies.differing_copies(variable)
            except Exception:  # a freed or uninitialized variable: not judged
                continue
            if difference is not None:
                found.append((entry, difference))
        with self._lock:
            self._differing_copies = found

    def _entry(self, row, keras):
        entry = self._variables.entry(row)
        if keras is not None:
            entry.keras_path = keras_variables.label(keras)
        return entry

    def _source_entry(self, source):
        """The entry of a gradient source: a Keras variable is the variable
        it wraps, named by its path."""
        keras, variable = _keras_and_variable(source)
        return self._entry(variable, keras)

    def _note_replica_plain(self, entry, location=None):
        """Counts a use of the plain variable `entry` in replica context (a
        read, or a gradient source at `location`); the first under a strategy
        of several replicas is located."""
        noted = self._replica_plain.get(entry)
        if noted is not None:
            noted[1] += 1
        elif _replicas_in_sync() > 1:
            if location is None:
                location = call_sites.caller_location(sys._getframe(1))
            self._replica_plain[entry] = [location, 1]

    def snapshot(self):
        """Everything counted so far, as JSON-ready lists of dicts."""
        with self._lock:
            names = self._variables.names()
            variables = [
                {"id": entry.serial, "name": names[entry],
                 "type": entry.type_name, "strategy": entry.strategy}
                for entry in self._variables.entries]
            watched = [
                {"variable": names[entry], "id": entry.serial, "how": how,
                 "kind": kind, "context": context, "replica": replica,
                 "strategy": strategy, "count": count}
                for (entry, how, kind, context, replica, strategy), count
                in sorted(self._watches.items(), key=_watch_order)]
            none_gradients = [
                {"source": names[entry], "id": entry.serial, "reason": reason,
                 "location": location, "context": context,
                 "message": self._messages[reason], "count": count}
                for (entry, reason, location, context), count in sorted(
                    self._none_gradients.items(),
                    key=lambda item: (item[0][0].serial, *item[0][1:]))]
            totals = [
                {"source": names[entry], "id": entry.serial,
                 "components": components, "workers": workers,
                 "location": location, "count": count}
                for (entry, components, workers, location), count in sorted(
                    self._totals.items(),
                    key=lambda item: (item[0][0].serial, *item[0][1:]))]
            warnings = self._warnings(names)
            gradient_calls = self._gradient_calls
            calls_around_runs = self._calls_around_runs
        return {"complete": self.complete, "variables": variables,
                "watched": watched, "gradient_calls": gradient_calls,
                "gradient_calls_around_runs": calls_around_runs,
                "none_gradients": none_gradients, "total_derivatives": totals,
                "warnings": warnings}

    def _warnings(self, names):
        warnings = [
            {"kind": REPLICA_PLAIN, "variable": names[entry], "id": entry.serial,
             "location": location, "count": count}
            for entry, (location, count) in sorted(
                self._replica_plain.items(), key=lambda item: item[0].serial)]
        warnings += [
            {"kind": COPIES_DIFFER, "variable": names[entry], "id": entry.serial,
             "location": "?", "count": 1, "subject": difference.describe()}
            for entry, difference in self._differing_copies]
        warnings += [
            {"kind": ONE_DEVICE, "variable": None, "id": None,
             "location": location, "count": count}
            for location, count in self._one_device.items()]
        warnings += [
            {"kind": REFUSAL, "variable": None, "id": None, "message": message,
             "location": location, "count": count}
            for (message, location), count in self._refusals.items()]
        warnings += [
            {"kind": kind, "variable": None, "id": None, "location": location,
             "count": count, **({"subject": subject} if subject else {})}
            for (kind, location, subject), count in self._unlike_one_device.items()]
        return warnings


def incomplete_reason(snapshot):
    """Why the recording an `EventCounts.snapshot()` holds is incomplete (tfdtape
    was uninstalled while it recorded), or None: what `run_report.build`
    takes with that snapshot."""
    return None if snapshot["complete"] else events.INCOMPLETE_NOTE


def _row_of(variable, resolved):
    """(the variable a decision counts for, how it was watched, the Keras
    variable that named it or None).

    The row's variable is the distributed container for a container or any
    of its components, else the variable itself (the tf.Variable a Keras
    variable wraps).
    """
    keras, inner = _keras_and_variable(variable)
    if resolution.is_distributed_variable(inner):
        watched_whole = len(resolved) == 1 and resolved[0] is inner
        return inner, CONTAINER if watched_whole else COMPONENTS, keras
    if len(resolved) == 1 and resolution.is_distributed_variable(resolved[0]):
        return resolved[0], CONTAINER, None  # a replica's read of its component
    container = resolution.container_of(inner)
    if container is not None:
        return container, COMPONENT, None
    if len(resolved) == 1 and resolved[0] is not inner:
        return resolved[0], CONTAINER, None  # another strategy's container
    return inner, PLAIN, keras


def _keras_and_variable(value):
    """(the Keras 3 variable `value` is, or None; the variable to count it
    under: the tf.Variable a Keras variable wraps, else `value` itself)."""
    if not keras_variables.is_keras_variable(value):
        return None, value
    inner = keras_variables.inner_or_none(value)
    return value, value if inner is None else inner


def _is_plain(variable):
    """True for a ResourceVariable of no container (distributed or
    aggregating)."""
    return (isinstance(variable, resource_variable_ops.ResourceVariable) and
            resolution.container_of(variable) is None and
            resolution.AGGREGATING_REFERENCE not in vars(variable))


def _replicas_in_sync():
    """The current strategy's replica count (1 with none)."""
    stack = ops.get_default_graph()._distribution_strategy_stack
    return stack[-1].strategy.num_replicas_in_sync if stack else 1


def _watch_order(item):
    (entry, how, kind, context, replica, strategy), _ = item
    return (entry.serial, how, kind, context, -1 if replica is None else replica,
            strategy)
