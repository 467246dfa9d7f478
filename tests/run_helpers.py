"""Running scripts under `python -m tfdtape run` in the tests, and the
recorder behind it in-process."""

import os
import pathlib
import subprocess
import sys

SCRIPTS = pathlib.Path(__file__).resolve().parent / "run_scripts"
"""The test scripts: small programs shaped like users' training scripts."""


def tfdtape_run(*arguments, stdin="", cwd=None, env=None):
    """Runs `python -m tfdtape run ARGUMENTS`; returns the CompletedProcess."""
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **(env or {}))
    environment.pop("TF_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "tfdtape", "run", *arguments],
                          input=stdin, capture_output=True, text=True,
                          cwd=cwd, env=environment, timeout=300)


def summary_of(stderr):
    """The summary block of stderr (from its first line on)."""
    start = stderr.index("tfdtape run: ")
    return stderr[start:]


def script_line(name, marker):
    """The line number of `marker` in run_scripts/`name`."""
    lines = (SCRIPTS / name).read_text().splitlines()
    return next(number for number, line in enumerate(lines, start=1)
                if marker in line)


class Recording:
    """An EventCounts (what `python -m tfdtape run` has) attached to the event bus for
    a with-block."""

    def __enter__(self):
        from tfdtape import events
        from tfdtape.cli import event_counts
        self._tracing = events
        self.recorder = event_counts.EventCounts()
        events.open_sink(self.recorder)
        return self.recorder

    def __exit__(self, *exc_info):
        self._tracing.close_sink(self.recorder)
