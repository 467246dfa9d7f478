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
  --quiet                   no summary on stderr
  --no-install              leave TensorFlow stock and record what it does
"""

import builtins
import json
import os
import sys
import types

from tfdtape import command_line
from tfdtape import run_recording
from tfdtape import run_report

USAGE = ("usage: python -m tfdtape run [--json PATH] [--fail-on-none-gradient] "
         "[--quiet] [--no-install] (SCRIPT | -m MODULE) [ARGS...]")
_FLAGS = {"--fail-on-none-gradient": "fail_on_none", "--quiet": "quiet",
          "--no-install": "no_install"}


class HelpRequested(Exception):
    """`run --help`: print the usage and exit 0."""


class Options:
    """The parsed command line of `run`."""

    def __init__(self):
        self.json = None
        self.fail_on_none = False
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
            raise command_line.UsageError(f"run: unknown option {argument}; {USAGE}")
        else:
            options.script = argument
            options.arguments = argv[position + 1:]
            break
        position += 1
    _check_target(options)
    return options


def _check_target(options):
    if options.script is None and options.module is None:
        raise command_line.UsageError(f"run: no script given; {USAGE}")
    if options.script is not None and options.script != "-":
        _check_script(options.script)
    if options.module is not None:
        import importlib.util  # pylint: disable=g-import-not-at-top
        top_level = options.module.split(".")[0]
        try:  # Only the top-level name: a dotted one would import its parents.
            found = bool(top_level) and importlib.util.find_spec(top_level) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise command_line.UsageError(
                f"run: no module named {options.module!r}")


def _check_script(path):
    """Raises UsageError unless `python PATH` would find something to run: a
    file, or a directory or zip archive with a `__main__.py`."""
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "__main__.py")):
            raise command_line.UsageError(
                f"run: cannot run {path}: a directory without __main__.py")
    elif not os.path.isfile(path):
        raise command_line.UsageError(f"run: cannot run {path}: no such file")
    elif _is_zip_application(path) is False:
        raise command_line.UsageError(
            f"run: cannot run {path}: a zip archive without __main__.py")


def _is_zip_application(path):
    """None if `path` is no zip archive, else whether it has a __main__.py."""
    import zipfile  # pylint: disable=g-import-not-at-top
    if not zipfile.is_zipfile(path):
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            return "__main__.py" in archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


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
        print(f"{USAGE}\n\n{__doc__.split(chr(10) + chr(10), 1)[1]}", end="")
        return command_line.EXIT_PASSED
    if options.json is not None:
        command_line.check_output_path(_json_path(options.json), "--json")
    command_line.check_tensorflow_installed()
    working_directory = os.getcwd()  # the script may chdir
    if options.no_install:  # the script's `import tfdtape` installs nothing
        os.environ["TFDTAPE_AUTOINSTALL"] = "0"
    recording = run_recording.RunRecording(observe_stock=options.no_install)
    try:
        recording.start()
        status, interrupted = _run_target(options)
        _join_other_threads()  # as Python waits for them before exiting
    except run_recording.InstallRefused:
        status, interrupted = command_line.EXIT_UNUSABLE, False
    finally:
        recording.stop()
    if recording.refusal is not None:
        raise command_line.UsageError(recording.refusal)
    snapshot, incomplete_reason = recording.snapshot()
    command = ([options.script] if options.script else ["-m", options.module])
    report = run_report.build(
        snapshot, command + options.arguments, status,
        installed=not options.no_install, task=task_of_config(),
        incomplete_reason=incomplete_reason)
    _flush(sys.stdout)
    if not options.quiet:
        print(run_report.summary(report), file=sys.stderr)
    if options.json is not None:  # the script may have set TF_CONFIG
        run_report.write_json(
            os.path.join(working_directory, _json_path(options.json)), report)
    if interrupted:
        _die_of_sigint()
    if status == 0 and options.fail_on_none and report["none_gradients"]:
        return command_line.EXIT_FAILED
    return status


def _json_path(pattern):
    """The --json path with `{task}` filled in from TF_CONFIG as it is now."""
    return pattern.replace("{task}", task_of_config() or "local")


def _flush(stream):
    """Flushes `stream` unless the script closed it."""
    try:
        stream.flush()
    except (ValueError, OSError):
        pass


def _join_other_threads():
    """Waits for the script's non-daemon threads, as Python does at exit,
    so that what they record is in the report."""
    import threading  # pylint: disable=g-import-not-at-top
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon and thread.is_alive():
            thread.join()


def _die_of_sigint():
    """Ends the process as an uncaught KeyboardInterrupt ends Python's:
    killed by SIGINT."""
    import signal  # pylint: disable=g-import-not-at-top
    _flush(sys.stderr)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)


def _run_target(options):
    """Runs the script or module as __main__.

    Returns:
        (exit status, whether a KeyboardInterrupt ended it). An uncaught
        exception goes to `sys.excepthook`, as Python would hand it, with
        tfdtape's own frames left out.
    """
    try:
        if options.script is not None:
            _run_script(options.script, options.arguments)
        else:
            _run_module(options.module, options.arguments)
    except SystemExit as exit_request:
        return _exit_status(exit_request.code), False
    except run_recording.InstallRefused:
        raise
    except BaseException as error:  # pylint: disable=broad-except
        trace = _user_traceback(error.__traceback__)
        sys.excepthook(type(error), error.with_traceback(trace), trace)
        return 1, isinstance(error, KeyboardInterrupt)
    return 0, False


def _run_script(path, arguments):
    """Runs what `python PATH ARGUMENTS` runs: a file (`__file__` and the
    code's filename absolute, as Python 3.9+ makes them), a directory or zip
    archive's `__main__.py`, or, for `-`, the program on stdin."""
    import importlib.machinery  # pylint: disable=g-import-not-at-top
    sys.argv = [path, *arguments]
    if path == "-":
        sys.path[0] = ""
        _exec_as_main(sys.stdin.read(), "<stdin>",
                      importlib.machinery.BuiltinImporter)
    elif os.path.isdir(path) or _is_zip_application(path):
        import runpy  # pylint: disable=g-import-not-at-top
        sys.path[0] = os.path.abspath(path)
        runpy._run_module_as_main("__main__", alter_argv=False)  # pylint: disable=protected-access
    else:
        absolute = os.path.join(os.getcwd(), path)  # as Python: not normalised
        sys.path[0] = os.path.dirname(os.path.realpath(absolute))
        with open(absolute, "rb") as source_file:
            source = source_file.read()
        _exec_as_main(source, absolute,
                      importlib.machinery.SourceFileLoader("__main__", absolute))


def _exec_as_main(source, filename, loader):
    """Executes `source` as a fresh `__main__` module."""
    code = compile(source, filename, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__file__ = filename
    main.__builtins__ = builtins
    main.__cached__ = None
    main.__loader__ = loader
    sys.modules["__main__"] = main
    exec(code, main.__dict__)  # pylint: disable=exec-used


def _run_module(name, arguments):
    """Runs module `name` as `python -m NAME ARGUMENTS` would."""
    import runpy  # pylint: disable=g-import-not-at-top
    sys.argv = [name, *arguments]  # runpy puts the module's path first
    sys.path[0] = os.getcwd()
    runpy._run_module_as_main(name, alter_argv=True)  # pylint: disable=protected-access


def _exit_status(code):
    """The process exit status Python gives for `SystemExit(code)`: None is
    0, an int (a bool included) is taken modulo 256, anything else is
    printed and gives 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return int(code) & 0xFF
    print(code, file=sys.stderr)
    return 1


def _user_traceback(trace):
    """The traceback from the script's first frame on (tfdtape's own frames
    dropped), as Python would print it."""
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    while trace is not None and trace.tb_frame.f_code.co_filename.startswith(here):
        trace = trace.tb_next
    return trace
