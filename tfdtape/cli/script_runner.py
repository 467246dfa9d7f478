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
import importlib.util
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
    elif not os.path.exists(path):  # a pipe such as /dev/fd/63 is fine
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
    except BaseException as error:
        trace = _user_traceback(error.__traceback__)
        try:
            _hand_to_excepthook(error.with_traceback(trace))
        except SystemExit as exit_request:  # the hook called sys.exit
            return _exit_status(exit_request.code), False
        return 1, isinstance(error, KeyboardInterrupt)
    return 0, False


def _hand_to_excepthook(error):
    """Hands an uncaught exception to `sys.excepthook` as Python does: if
    the hook is missing or fails, says so on stderr and prints the exception
    with Python's own hook."""
    hook = getattr(sys, "excepthook", None)
    if hook is None:
        _write_stderr("sys.excepthook is missing\n")
    else:
        try:
            hook(type(error), error, error.__traceback__)
            return
        except SystemExit:
            raise
        except BaseException as hook_error:
            import traceback
            _write_stderr("Error in sys.excepthook:\n" + "".join(
                traceback.format_exception(
                    type(hook_error), hook_error,
                    _user_traceback(hook_error.__traceback__), chain=False)) +
                "\nOriginal exception was:\n")
    sys.__excepthook__(type(error), error, error.__traceback__)


def write_quietly(stream, text):
    """Writes `text` to `stream` and flushes it, unless the script closed
    it, removed it (None) or put something there that takes no text, as
    Python's own messages at exit are lost then."""
    try:
        stream.write(text)
        stream.flush()
    except (AttributeError, TypeError, ValueError, OSError):
        pass


def _write_stderr(text):
    write_quietly(sys.stderr, text)


def finish_threads():
    """Stops idle thread pools and waits for the non-daemon threads, as the
    interpreter does at exit (before `atexit` handlers), so that what those
    threads do happens before the report."""
    import threading
    try:
        threading._shutdown()
    except KeyboardInterrupt as interrupt:  # at exit Python reports and goes on
        import traceback
        _write_stderr(  # in the shape of Python's report of an unraisable error
            f"Exception ignored in: {threading!r}\n"
            "Traceback (most recent call last):\n" +
            "".join(traceback.format_tb(interrupt.__traceback__.tb_next)) +
            f"KeyboardInterrupt: {interrupt}\n")


def _run_script(path, arguments):
    """Runs what `python PATH ARGUMENTS` runs: a file (`__file__` and the
    code's filename absolute, as Python 3.9+ makes them), a directory or zip
    archive's `__main__.py`, or, for `-`, the program on stdin."""
    sys.argv = [path, *arguments]
    if path == "-":
        _set_path_entry("")
        stdin = getattr(sys.stdin, "buffer", sys.stdin)  # bytes keep the coding
        source = stdin.read() if stdin is not None else b""  # stdin closed
        _exec_as_main(_code(source, "<stdin>"), "<stdin>",
                      importlib.machinery.BuiltinImporter)
    elif os.path.isdir(path) or _is_zip_application(path):
        import runpy
        _set_path_entry(os.path.abspath(path))
        sys.modules["__main__"] = _fresh_main()
        runpy._run_module_as_main("__main__", alter_argv=False)
    else:
        absolute = os.path.join(os.getcwd(), path)  # as Python: not normalised
        _set_path_entry(_script_folder(absolute))
        with open(absolute, "rb") as source_file:
            source = source_file.read()
        if source[:4] == importlib.util.MAGIC_NUMBER:  # compiled, as python runs it
            import marshal
            _exec_as_main(marshal.loads(source[16:]), absolute,
                          importlib.machinery.SourcelessFileLoader("__main__", absolute))
        else:
            _exec_as_main(_code(source, absolute), absolute,
                          importlib.machinery.SourceFileLoader("__main__", absolute))


def _script_folder(path):
    """The folder Python puts first on sys.path for the script at `path`:
    one symlink of the script read, then the real path if there is one (a
    pipe such as /dev/stdin has none), as CPython computes it."""
    try:
        link = os.readlink(path)
    except OSError:
        link = ""
    if os.sep in link:
        path = os.path.join(os.path.dirname(path), link)  # an absolute link wins
    try:
        path = os.path.realpath(path, strict=True)
    except OSError:  # a pipe's link names no file: kept as it is
        pass
    return os.path.dirname(path)


def _run_module(name, arguments):
    """Runs module `name` as `python -m NAME ARGUMENTS` would."""
    import runpy
    sys.argv = [name, *arguments]  # runpy puts the module's path first
    _set_path_entry(os.getcwd())
    sys.modules["__main__"] = _fresh_main()
    runpy._run_module_as_main(name, alter_argv=True)


def _set_path_entry(entry):
    """Makes `entry` sys.path[0], where Python puts the script's folder; with
    -P or PYTHONSAFEPATH Python puts nothing there, and neither does this."""
    if not getattr(sys.flags, "safe_path", False):  # the flag is new in 3.11
        sys.path[0] = entry


def _fresh_main():
    """An empty `__main__` module, as the interpreter makes it at start-up."""
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    main.__annotations__ = {}
    main.__loader__ = importlib.machinery.BuiltinImporter
    return main


def _code(source, filename):
    """Compiles a program's `source` (bytes keep their coding cookie)."""
    return compile(source, filename, "exec", dont_inherit=True)


def _exec_as_main(code, filename, loader):
    """Executes `code` as a fresh `__main__` module."""
    main = _fresh_main()
    main.__file__ = filename
    main.__cached__ = None
    main.__loader__ = loader
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def _is_zip_application(path):
    """None if `path` is no zip archive, else whether it has a __main__.py."""
    import zipfile
    if not os.path.isfile(path) or not zipfile.is_zipfile(path):  # a pipe: read once
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
    _write_stderr(f"{code}\n")
    return 1


def _user_traceback(trace):
    """The traceback from the script's first frame on (tfdtape's own frames
    dropped), as Python would print it."""
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    while trace is not None and trace.tb_frame.f_code.co_filename.startswith(here):
        trace = trace.tb_next
    return trace
