"""`tfdtape.trace()`: a record of every watch decision tfdtape makes.

A `Trace` is a sink of `tfdtape.events`: while its block is open, every
decision tfdtape's tape functions take is kept as a `events.WatchEvent`, from
any thread. It needs tfdtape installed, since TensorFlow's own functions
report nothing, and does not install it, which would change the program it
observes.
"""

import contextlib

from tfdtape import errors
from tfdtape import events
from tfdtape import keras_variables
from tfdtape import patching


class Trace:
    """The events recorded while a `trace()` block was open, in order.

    Attributes:
        events: the WatchEvents.
        complete: False once tfdtape was uninstalled while the trace was
            open: decisions TensorFlow's own functions took then are missing.
    """

    def __init__(self):
        self.events = []
        self.complete = True

    def add_event(self, event):
        """Keeps a WatchEvent (list.append is atomic: no lock needed)."""
        self.events.append(event)

    def add_gradient(self, event):
        """Gradient calls are not part of a trace."""
        del event

    def add_refusal(self, event):
        """Refusals are not part of a trace (they raise where they happen)."""
        del event

    def add_warning(self, event):
        """Warnings are the run report's, not part of a trace."""
        del event

    def report(self):
        """A readable table: one row per event, what was watched and where."""
        rows = [("kind", "variable", "shape", "context", "replica",
                 "watched", "devices")]
        for event in self.events:
            rows.append((
                event.kind, _name(event.variable),
                str(getattr(event.variable, "shape", "?")),
                event.context,
                "-" if event.replica_id is None else str(event.replica_id),
                ", ".join(f"{type(w).__name__} {_name(w)}" for w in event.resolved),
                ", ".join(_short_device(w) for w in event.resolved)))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        table = "\n".join("  ".join(cell.ljust(width) for cell, width
                                    in zip(row, widths)).rstrip()
                          for row in rows)
        if self.complete:
            return table
        return f"{events.INCOMPLETE_NOTE}\n{table}"


def _name(value):
    return keras_variables.label(value)


def _short_device(value):
    device = str(getattr(value, "device", "") or "?")
    return device.split("device:")[-1]


@contextlib.contextmanager
def trace():
    """Records every watch decision made inside the block, from any thread.

    Only tfdtape's tape functions report decisions, so a trace needs tfdtape
    installed; it does not install tfdtape itself, which would change the
    program it observes.

    Yields:
        the `Trace` whose `events` fill in as decisions are made.

    Raises:
        RuntimeError: tfdtape is not installed.
    """
    if not patching.is_installed():
        found, remedy = (
            ("TensorFlow's own, observed as stock", events.NO_INSTALL_REMEDY)
            if events.observing_stock else
            ("TensorFlow's own, which report nothing",
             "Call tfdtape.install() first (`import tfdtape` does, unless "
             "TFDTAPE_AUTOINSTALL=0)"))
        raise RuntimeError(errors.message(
            "cannot open a trace: tfdtape is not installed", "tfdtape.trace",
            "tfdtape's tape functions in TensorFlow, which report each watch "
            "decision", found, remedy))
    recording = Trace()
    events.open_sink(recording)
    try:
        yield recording
    finally:
        events.close_sink(recording)
