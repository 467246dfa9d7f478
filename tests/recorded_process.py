"""Runs a worker script with tests/exercise_recorder.py recording:
`python tests/recorded_process.py SCRIPT ARGS...` runs SCRIPT as `python
SCRIPT ARGS...` would, then writes what the process ran to the directory
TFDTAPE_RECORD_EXERCISE names (tests/loopback.py does this under `pytest
--record-exercise`)."""

import atexit
import os
import runpy
import sys

import exercise_recorder


def main():
    directory = os.environ[exercise_recorder.ENVIRONMENT]
    exercise_recorder.start()
    atexit.register(exercise_recorder.write, directory, f"process-{os.getpid()}")
    script = os.path.abspath(sys.argv[1])
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
