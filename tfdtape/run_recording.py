"""The recording side of `python -m tfdtape run`: tfdtape (or, with
--no-install, the stock observers) goes into TensorFlow when the script
imports it, and a recorder listens from then until the script ends.

Nothing here imports TensorFlow before the script does: `RunRecording`
watches for the script's first `import tensorflow` (`tfdtape.import_hook`)
and does its work right after TensorFlow's `__init__` has run, before that
import statement returns. If TensorFlow was imported before the run began
(by a `sitecustomize`, say), the work happens at once, before the script.
"""

import contextlib
import sys

from tfdtape import command_line
from tfdtape import import_hook

UNSEEN_IMPORT_NOTE = (
    "note: TensorFlow was imported by a route tfdtape run did not see (an "
    "import hook ahead of tfdtape's on sys.meta_path, or a tfdtape module "
    "import that never ended), so tfdtape was not installed and nothing was "
    "recorded. Add `import tfdtape` at the top of the script instead.")
"""Why a run in which TensorFlow was imported recorded nothing."""


class InstallRefused(BaseException):
    """tfdtape cannot go into the TensorFlow the script imported (an
    unsupported release, another library's patch): the run stops with one
    line and exit 2. A BaseException, so that a script's `except Exception`
    around its import does not carry on without tfdtape."""


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
        self.refusal = None
        """Why tfdtape could not go into TensorFlow (one line), or None."""

    def start(self):
        """Starts watching for TensorFlow; if it is already imported, installs
        at once.

        Raises:
            InstallRefused: TensorFlow is already imported and tfdtape cannot
                go into it.
        """
        self._hook.start()

    def stop(self):
        """Stops watching and recording, and takes out the observers."""
        self._hook.stop()
        self._cleanup.close()

    def snapshot(self):
        """(what the recorder counted, why it is incomplete or None); an
        empty recording if TensorFlow was never imported."""
        if self.recorder is not None:
            snapshot = self.recorder.snapshot()
            if snapshot["complete"]:
                return snapshot, None
            from tfdtape import tracing  # pylint: disable=g-import-not-at-top
            return snapshot, tracing.INCOMPLETE_NOTE
        from tfdtape import run_report  # pylint: disable=g-import-not-at-top
        imported = "tensorflow" in sys.modules
        return (dict(run_report.EMPTY_SNAPSHOT, complete=not imported),
                UNSEEN_IMPORT_NOTE if imported else None)

    def _tensorflow_arrived(self):
        try:
            command_line.check_release(sys.modules["tensorflow"])
            self._put_in()
        except command_line.UsageError as error:
            self.refusal = str(error)
            raise InstallRefused(self.refusal) from None
        # pylint: disable=g-import-not-at-top
        from tfdtape import recorder as recorder_lib
        from tfdtape import tracing
        self.recorder = recorder_lib.Recorder()
        tracing.open_sink(self.recorder)
        self._cleanup.callback(tracing.close_sink, self.recorder)

    def _put_in(self):
        """Installs tfdtape, or puts the stock observers in place."""
        # pylint: disable=g-import-not-at-top
        if self._observe_stock:
            from tfdtape import observers
            self._cleanup.enter_context(observers.observe_stock())
            return
        from tfdtape import errors
        from tfdtape import patching
        try:
            patching.install()
        except (errors.UnsupportedTensorFlowError,
                errors.PatchConflictError) as error:
            raise command_line.UsageError(
                str(error).removeprefix("tfdtape: ")) from None
