"""Running scripts under `python -m tfdtape run` in the tests."""

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
