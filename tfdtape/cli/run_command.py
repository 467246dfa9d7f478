"""`python -m tfdtape run [OPTIONS] SCRIPT [ARGS...]` and
`python -m tfdtape run [OPTIONS] -m MODULE [ARGS...]`.

Runs the script as `__main__` exactly as `python SCRIPT ARGS` would
(`sys.argv`, `sys.path[0]`, `__file__`, exit status, uncaught exceptions
with their traceback, `SystemExit` codes; stdin and stdout are the
script's; SCRIPT may be a file, a directory or zip archive with a
`__main__.py`, or - for stdin), installs tfdtape when the script imports
TensorFlow, and records what the gradient tapes did meanwhile. At exit it
writes a summary on stderr and, with --json, the JSON report.

Options (before SCRIPT or -m):
  --json PATH               write the JSON report; `{task}` in PATH becomes
                            the TF_CONFIG task, e.g. worker-0 (else "local")
  --fail-on-none-gradient   exit 1 if a source got a None gradient and the
                            script itself succeeded
  --fail-on-warning         exit 1 if the summary has a warning and the
                            script itself succeeded
  --verbose                 list one row per variable and every group
  --quiet                   no summary on stderr
  --no-install              leave TensorFlow stock and record what it does
"""

import functools
import json
import os
import sys

from tfdtape.cli import command_line
from tfdtape.cli import run_report
from tfdtape.cli import run_session
from tfdtape.cli import script_runner


def usage():
    """The usage line, with the program named as the user started it."""
    return (f"usage: {command_line.program_name()} run [--json PATH] "
            "[--fail-on-none-gradient] [--fail-on-warning] [--verbose] "
            "[--quiet] [--no-install] (SCRIPT | -m MODULE) [ARGS...]")


_FLAGS = {"--fail-on-none-gradient": "fail_on_none",
          "--fail-on-warning": "fail_on_warning", "--verbose": "verbose",
          "--quiet": "quiet", "--no-install": "no_install"}


class HelpRequested(Exception):
    """`run --help`: print the usage and exit 0."""


class Options:
    """The parsed command line of `run`."""

    def __init__(self):
        self.json = None
        self.fail_on_none = False
        self.fail_on_warning = False
        self.verbose = False
        self.quiet = False
        self.no_install = False
        self.script = None
        self.module = None
        self.arguments = []


def parse(argv):
    """Parses run's arguments: options, then SCRIPT or -m MODULE, then the
    script's own arguments (passed on untouched).

    Raises:
        command_line.UsageError: an unknown option, a missing value, no
            script, or a script or module that does not exist.
    """
    options = Options()
    position = 0
    while position < len(argv):
        argument = argv[position]
        if argument in _FLAGS:
            setattr(options, _FLAGS[argument], True)
        elif argument == "--json" or argument.startswith("--json="):
            if argument == "--json":
                position += 1
                if position == len(argv):
                    raise command_line.UsageError("--json needs a path")
                options.json = argv[position]
            else:
                options.json = argument[len("--json="):]
        elif argument == "-m" or (argument.startswith("-m") and
                                  not argument.startswith("--")):
            if argument == "-m":
                position += 1
                if position == len(argv):
                    raise command_line.UsageError("-m needs a module name")
            options.module = argv[position] if argument == "-m" else argument[2:]
            options.arguments = argv[position + 1:]
            break
        elif argument in ("-h", "--help"):
            raise HelpRequested()
        elif argument == "--":
            if position + 1 < len(argv):
                options.script = argv[position + 1]
                options.arguments = argv[position + 2:]
            break
        elif argument.startswith("-") and argument != "-":
            raise command_line.UsageError(f"run: unknown option {argument}; {usage()}")
        else:
            options.script = argument
            options.arguments = argv[position + 1:]
            break
        position += 1
    _check_target(options)
    return options


def _check_target(options):
    if options.script is None and options.module is None:
        raise command_line.UsageError(f"run: no script given; {usage()}")
    if options.script is not None:
        try:
            script_runner.check_script(options.script)
        except script_runner.NothingToRun as error:
            raise command_line.UsageError(f"run: {error}") from None
    if options.module is not None:
        import importlib.util
        top_level = options.module.split(".")[0]
        try:  # Only the top-level name: a dotted one would import its parents.
            found = bool(top_level) and importlib.util.find_spec(top_level) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise command_line.UsageError(
                f"run: no module named {options.module!r}")


def task_of_config():
    """The TF_CONFIG task as 'type-index' (e.g. worker-0), or None without a
    readable one."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return None
    try:
        task = json.loads(raw)["task"]
        return f"{task['type']}-{task['index']}"
    except (ValueError, KeyError, TypeError):
        return None


def run(argv):
    """Runs `python -m tfdtape run ARGV`; returns the exit status."""
    try:
        options = parse(argv)
    except HelpRequested:
        print(f"{usage()}\n\n{__doc__.split(chr(10) + chr(10), 1)[1]}", end="")
        return command_line.EXIT_PASSED
    if options.json is not None:
        command_line.check_output_path(_json_path(options.json), "--json")
    command_line.check_tensorflow_installed()
    working_directory = os.getcwd()  # the script may chdir
    process = os.getpid()  # a child the script forks does not report
    if options.no_install:  # the script's `import tfdtape` installs nothing
        os.environ["TFDTAPE_AUTOINSTALL"] = "0"
    recording = run_session.RunRecording(observe_stock=options.no_install)
    try:
        recording.start()
        status, interrupted = script_runner.run_as_main(
            options.script, options.module, options.arguments)
        script_runner.finish_threads()
    finally:
        recording.stop()
    if os.getpid() != process:
        return status
    snapshot, incomplete_reason = recording.snapshot()
    command = ([options.script] if options.script else ["-m", options.module])
    run_status, reason = _run_status(options, status, snapshot)
    build = functools.partial(
        run_report.build, snapshot, command + options.arguments, status,
        installed=not options.no_install, task=task_of_config(),
        incomplete_reason=incomplete_reason)
    report = build(run_exit_status=run_status, run_exit_reason=reason)
    written = options.json is None or _write_json(
        os.path.join(working_directory, _json_path(options.json)), report)
    if not written and status == 0:  # said in one line already
        report = build(run_exit_status=command_line.EXIT_UNUSABLE,
                       run_exit_reason="the --json report could not be written")
    script_runner.write_quietly(sys.stdout, "")  # the script's output first
    if not options.quiet:
        script_runner.write_quietly(
            sys.stderr, run_report.summary(report, relative_to=working_directory,
                                           verbose=options.verbose) + "\n")
    if interrupted:
        _end_interrupted()
    return report["run_exit_status"]


def _run_status(options, status, snapshot):
    """(the run's exit status, why it is not the script's) or (None, None)
    when it is the script's."""
    if status != 0:
        return None, None
    reasons = []
    if options.fail_on_none and snapshot["none_gradients"]:
        count = sum(item["count"] for item in snapshot["none_gradients"])
        reasons.append(f"--fail-on-none-gradient, and {count} None gradient"
                       + ("" if count == 1 else "s"))
    if options.fail_on_warning and snapshot["warnings"]:
        count = len(snapshot["warnings"])
        reasons.append(f"--fail-on-warning, and {count} warning"
                       + ("" if count == 1 else "s"))
    if not reasons:
        return None, None
    return command_line.EXIT_FAILED, "; ".join(reasons)


def _write_json(path, report):
    """Writes the JSON report (the script may have set TF_CONFIG, or removed
    the folder, since the path was checked); on failure says so in one line
    and returns False."""
    try:
        run_report.write_json(path, report)
    except OSError as error:
        script_runner.write_quietly(
            sys.stderr, f"tfdtape: --json {path}: cannot write the report "
            f"({error.strerror or error})\n")
        return False
    return True


def _json_path(pattern):
    """The --json path with `{task}` filled in from TF_CONFIG as it is now."""
    return pattern.replace("{task}", task_of_config() or "local")


def _end_interrupted():
    """Ends the run as an uncaught KeyboardInterrupt ends Python: its
    traceback was printed already, so it is raised on with a silent
    `sys.excepthook`, and Python runs the `atexit` handlers, finalizes and
    then kills the process by SIGINT."""
    sys.excepthook = lambda *unused: None
    raise KeyboardInterrupt
