"""The recording side of `python -m tfdtape run`: tfdtape (or, with
--no-install, the stock observers) goes into TensorFlow when the script
imports it, and a recorder listens from then until the script ends.

Nothing here imports TensorFlow before the script does: `RunRecording`
watches for the script's first `import tensorflow` (`tfdtape.import_hook`)
and does its work right after TensorFlow's `__init__` has run, before that
import statement returns. If TensorFlow was imported before the run began
(by a `sitecustomize`, say), the work happens at once, before the script.
If tfdtape cannot go into that TensorFlow (an untested release without the
opt-in of `tfdtape.release_policy`, another library's patch), the run ends
there: one line on stderr, exit status 2.
"""

import contextlib
import logging
import os
import sys

from tfdtape import import_hook
from tfdtape import release_policy
from tfdtape.cli import command_line
from tfdtape.cli import script_runner

UNSEEN_IMPORT_NOTE = (
    "note: TensorFlow was imported by a route tfdtape run did not see (an "
    "import hook ahead of tfdtape's on sys.meta_path, or a tfdtape module "
    "import that never ended), so tfdtape was not installed and nothing was "
    "recorded. Add `import tfdtape` at the top of the script instead.")
"""Why a run in which TensorFlow was imported recorded nothing."""


class RunRecording:
    """Installs tfdtape (or observes stock TensorFlow) when the script
    imports TensorFlow, and records from then on."""

    def __init__(self, observe_stock):
        self._observe_stock = observe_stock
        self._hook = import_hook.AfterImport("tensorflow", self._tensorflow_arrived,
                                             defer_prefix="tfdtape.")
        self._cleanup = contextlib.ExitStack()
        self.recorder = None
        """The recorder, once TensorFlow has been imported."""

    def start(self):
        """Starts watching for TensorFlow; if it is already imported, installs
        at once."""
        self._hook.start()

    def stop(self):
        """Stops watching and recording, and takes out the observers."""
        self._hook.stop()
        self._cleanup.close()

    def snapshot(self):
        """(what the recorder counted, why it is incomplete or None); an
        empty recording if TensorFlow was never imported."""
        if self.recorder is not None:
            from tfdtape.cli import event_counts
            self.recorder.check_copies()
            snapshot = self.recorder.snapshot()
            return snapshot, event_counts.incomplete_reason(snapshot)
        from tfdtape.cli import run_report
        version = getattr(sys.modules.get("tensorflow"), "__version__", None)
        imported = isinstance(version, str)  # not a stand-in the script made
        return (dict(run_report.EMPTY_SNAPSHOT, complete=not imported),
                UNSEEN_IMPORT_NOTE if imported else None)

    def _tensorflow_arrived(self):
        try:
            tensorflow = command_line.check_release(sys.modules["tensorflow"])
            if not self._observe_stock:
                _check_policy(tensorflow.__version__)
            self._put_in()
        except command_line.UsageError as error:
            _stop_the_run(f"tfdtape: {error}")

        from tfdtape import events
        from tfdtape.cli import event_counts
        self.recorder = event_counts.EventCounts()
        events.open_sink(self.recorder)
        self._cleanup.callback(events.close_sink, self.recorder)

    def _put_in(self):
        """Installs tfdtape, or puts the stock observers in place."""

        from tfdtape.cli import replica_clipping
        if self._observe_stock:
            from tfdtape.cli import one_device_distribution
            from tfdtape.cli import stock_observers
            self._cleanup.enter_context(stock_observers.observe_stock())
            self._cleanup.enter_context(replica_clipping.observe_replica_clipping())
            self._cleanup.enter_context(
                one_device_distribution.observe_one_device_distributions())
            return
        import runpy

        from tfdtape import errors
        from tfdtape import frame_filters
        from tfdtape import patching
        # The command line's frames (runpy's and tfdtape's) are not the
        # script's: TensorFlow's "defined at" stacks leave them out.
        frame_filters.also_hide({runpy.__file__, "<frozen runpy>"})
        log = logging.getLogger("tfdtape")
        quiet_before, log.disabled = log.disabled, True  # the script's output only
        try:
            patching.install()
        except (errors.UnsupportedTensorFlowError,
                errors.PatchConflictError) as error:
            raise command_line.UsageError(
                str(error).removeprefix("tfdtape: ")) from None
        finally:
            log.disabled = quiet_before
        from tfdtape.cli import scale_traps
        self._cleanup.enter_context(scale_traps.observe_average_losses())
        self._cleanup.enter_context(replica_clipping.observe_replica_clipping())


def _check_policy(version):
    """Raises UsageError if the release policy refuses TensorFlow `version`
    (checked before tfdtape's TensorFlow-facing modules are imported)."""
    try:
        refusal = release_policy.refusal(version)
    except ValueError as error:  # an unreadable opt-in
        refusal = str(error)
    if refusal:
        raise command_line.UsageError(refusal.removeprefix("tfdtape: "))


def _stop_the_run(line):
    """Ends the process with `line` on stderr and exit status 2: tfdtape
    cannot go into this TensorFlow, so nothing the run reports would hold.
    Whichever thread imported TensorFlow, the whole run stops there."""
    for stream in (sys.stdout, sys.stderr):
        script_runner.write_quietly(stream, "")  # flushes what the script wrote
    os.write(2, (line + "\n").encode())
    os._exit(command_line.EXIT_UNUSABLE)
