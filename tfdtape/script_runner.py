"""Running a script or module as `__main__`, as `python` runs it: the
running half of `python -m tfdtape run`.

`check_script(path)` refuses what `python PATH` would find nothing to run
in. `run_as_main(script, module, arguments)` runs a file, a directory or zip
archive with a `__main__.py`, `-` (the program on stdin) or a module (`-m`)
in a fresh `__main__` module, with `sys.argv`, `sys.path[0]`, `__file__`,
`__loader__` and `__spec__` as Python sets them, and returns the exit status
Python would give. `finish_threads()` does what Python does at exit before
its `atexit` handlers: it stops idle thread pools and waits for non-daemon
threads.
"""

import builtins
import importlib.machinery
import os
import sys
import types


class NothingToRun(Exception):
    """`python PATH` would find nothing to run at PATH."""


def check_script(path):
    """Raises NothingToRun unless `python PATH` would find something to run:
    `-` (stdin), a file, or a directory or zip archive with a `__main__.py`."""
    if path == "-":
        return
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "__main__.py")):
            raise NothingToRun(f"cannot run {path}: a directory without __main__.py")
    elif not os.path.isfile(path):
        raise NothingToRun(f"cannot run {path}: no such file")
    elif _is_zip_application(path) is False:
        raise NothingToRun(f"cannot run {path}: a zip archive without __main__.py")


def run_as_main(script, module, arguments):
    """Runs `script` (or, if it is None, `module` as with -m) as `__main__`.

    Returns:
        (exit status, whether a KeyboardInterrupt ended it). An uncaught
        exception goes to `sys.excepthook`, as Python would hand it, with
        tfdtape's own frames left out.
    """
    try:
        if script is not None:
            _run_script(script, arguments)
        else:
            _run_module(module, arguments)
    except SystemExit as exit_request:
        return _exit_status(exit_request.code), False
    except BaseException as error:  # pylint: disable=broad-except
        trace = _user_traceback(error.__traceback__)
        sys.excepthook(type(error), error.with_traceback(trace), trace)
        return 1, isinstance(error, KeyboardInterrupt)
    return 0, False


def finish_threads():
    """Stops idle thread pools and waits for the non-daemon threads, as the
    interpreter does at exit (before `atexit` handlers), so that what those
    threads do happens before the report."""
    import threading  # pylint: disable=g-import-not-at-top
    threading._shutdown()  # pylint: disable=protected-access


def _run_script(path, arguments):
    """Runs what `python PATH ARGUMENTS` runs: a file (`__file__` and the
    code's filename absolute, as Python 3.9+ makes them), a directory or zip
    archive's `__main__.py`, or, for `-`, the program on stdin."""
    sys.argv = [path, *arguments]
    if path == "-":
        _set_path_entry("")
        stdin = getattr(sys.stdin, "buffer", sys.stdin)  # bytes keep the coding
        _exec_as_main(stdin.read(), "<stdin>", importlib.machinery.BuiltinImporter)
    elif os.path.isdir(path) or _is_zip_application(path):
        import runpy  # pylint: disable=g-import-not-at-top
        _set_path_entry(os.path.abspath(path))
        sys.modules["__main__"] = _fresh_main()
        runpy._run_module_as_main("__main__", alter_argv=False)  # pylint: disable=protected-access
    else:
        absolute = os.path.join(os.getcwd(), path)  # as Python: not normalised
        _set_path_entry(os.path.dirname(os.path.realpath(absolute)))
        with open(absolute, "rb") as source_file:
            source = source_file.read()
        _exec_as_main(source, absolute,
                      importlib.machinery.SourceFileLoader("__main__", absolute))


def _run_module(name, arguments):
    """Runs module `name` as `python -m NAME ARGUMENTS` would."""
    import runpy  # pylint: disable=g-import-not-at-top
    sys.argv = [name, *arguments]  # runpy puts the module's path first
    _set_path_entry(os.getcwd())
    sys.modules["__main__"] = _fresh_main()
    runpy._run_module_as_main(name, alter_argv=True)  # pylint: disable=protected-access


def _set_path_entry(entry):
    """Makes `entry` sys.path[0], where Python puts the script's folder; with
    -P or PYTHONSAFEPATH Python puts nothing there, and neither does this."""
    if not sys.flags.safe_path:
        sys.path[0] = entry


def _fresh_main():
    """An empty `__main__` module, as the interpreter makes it at start-up."""
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    main.__annotations__ = {}
    main.__loader__ = importlib.machinery.BuiltinImporter
    return main


def _exec_as_main(source, filename, loader):
    """Executes `source` (str or bytes) as a fresh `__main__` module."""
    code = compile(source, filename, "exec", dont_inherit=True)
    main = _fresh_main()
    main.__file__ = filename
    main.__cached__ = None
    main.__loader__ = loader
    sys.modules["__main__"] = main
    exec(code, main.__dict__)  # pylint: disable=exec-used


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


_C_LONG = 2 ** 63


def _exit_status(code):
    """The process exit status Python gives for `SystemExit(code)`: None is
    0; an int (a bool included) is taken modulo 256, or is 255 if it does not
    fit a C long; anything else is printed on stderr and gives 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return int(code) & 0xFF if -_C_LONG <= code < _C_LONG else 0xFF
    if sys.stderr is not None:
        print(code, file=sys.stderr)
    return 1


def _user_traceback(trace):
    """The traceback from the script's first frame on (tfdtape's own frames
    dropped), as Python would print it."""
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    while trace is not None and trace.tb_frame.f_code.co_filename.startswith(here):
        trace = trace.tb_next
    return trace
