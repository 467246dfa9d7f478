"""Calling a function right after a package is first imported.

`python -m tfdtape run` installs tfdtape when the script imports TensorFlow,
not before the script starts, so that the script runs as under `python`:
what it does before `import tensorflow` (environment settings, its own
imports) comes first, and a script that never imports TensorFlow never
loads it.

`AfterImport(package, callback, defer_prefix).start()` puts a finder first
on `sys.meta_path`. It asks the finders after it for the package's spec and
wraps the loader, so that `callback()` runs in the importing thread right
after the package's `__init__` has run, before the import statement
returns. While a module whose name starts with `defer_prefix` is being
imported (tfdtape's own modules import TensorFlow, and the callback needs
them whole), the call waits until the last such import ends. A finder put
ahead of this one later (pytest's assertion rewriter, which claims tfdtape's
modules) is passed again at the next import this finder sees; until then, a
deferring module another loader runs is seen by the initializing mark
importlib puts on its spec, and the call comes with the first import after
that module has ended. The finder leaves `sys.meta_path` before the callback
runs, and every module keeps its original loader.

wrapt's post-import hooks (which come with TensorFlow) fire at once when
the module is in `sys.modules`, even half imported, and their finder stays
on `sys.meta_path`: hence this small finder of our own.
"""

import importlib.abc
import sys
import threading

from tfdtape import process_state


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls `callback()` once, right after `package` is first imported.

    An exception the callback raises propagates from the import statement
    that triggered it, which fails.
    """

    def __init__(self, package, callback, defer_prefix):
        self._package = package
        self._callback = callback
        self._defer_prefix = defer_prefix
        self._lock = process_state.lock()
        self._imported = False      # the package's __init__ has finished
        self._deferring = 0         # deferring imports in progress here
        self._wrapped = set()       # names whose loader reports here
        self._done = False          # called back, or stopped
        self._asking = threading.local()  # names this thread is looking up

    def start(self):
        """Calls back now if the package is already imported, else watches
        for its import."""
        if self._package in sys.modules:
            self._imported = True
            self._call_if_due()
        else:
            sys.meta_path.insert(0, self)

    def stop(self):
        """Stops watching; a callback not made by now is not made."""
        with self._lock:
            self._done = True
            self._leave_meta_path()

    def find_spec(self, fullname, path, target=None):
        """The spec the finders after this one give, with a loader that
        reports back. A finder that asks every finder (this one included)
        gets None from this one while it is being asked."""
        if not self._done:
            self._stay_first()
            if self._imported:
                self._call_if_due()  # a deferring module another loader ran may be done
        is_package = fullname == self._package
        if not is_package and not fullname.startswith(self._defer_prefix):
            return None
        asking = self._asking.__dict__.setdefault("names", set())
        if fullname in asking:
            return None
        asking.add(fullname)
        try:
            spec = self._spec_after_this(fullname, path, target)
        finally:
            asking.discard(fullname)
        if spec is not None and hasattr(spec.loader, "exec_module") and not self._done:
            spec.loader = _ReportingLoader(spec.loader, self, is_package)
            self._wrapped.add(fullname)
        return spec

    def _stay_first(self):
        """Moves this finder back to the front of sys.meta_path if a finder
        was put ahead of it (pytest's assertion rewriter claims tfdtape's
        modules when it is ahead): this finder hands every name but its own
        on untouched, so going first changes nothing for the others."""
        with self._lock:
            if sys.meta_path and sys.meta_path[0] is not self and self in sys.meta_path:
                sys.meta_path.remove(self)
                sys.meta_path.insert(0, self)

    def _spec_after_this(self, fullname, path, target):
        finders = list(sys.meta_path)
        later = finders[finders.index(self) + 1:] if self in finders else finders
        for finder in later:
            find_spec = getattr(finder, "find_spec", None)
            if find_spec is not None:
                spec = find_spec(fullname, path, target)
                if spec is not None:
                    return spec
        return None

    def _exec_starts(self, is_package):
        if not is_package:
            with self._lock:
                self._deferring += 1

    def _exec_ends(self, is_package, succeeded):
        with self._lock:
            if is_package:
                self._imported = succeeded
            else:
                self._deferring -= 1
        self._call_if_due()

    def _call_if_due(self):
        with self._lock:
            if (self._done or not self._imported or self._deferring or
                    self._other_loader_importing()):
                return
            self._done = True
            self._leave_meta_path()
        self._callback()

    def _other_loader_importing(self):
        """True while a module under the defer prefix that another loader
        runs (one ahead of this finder, such as pytest's assertion
        rewriter) is half imported: importlib marks its spec initializing."""
        for name, module in list(sys.modules.items()):
            if (name.startswith(self._defer_prefix) and name not in self._wrapped
                    and getattr(getattr(module, "__spec__", None),
                                "_initializing", False)):
                return True
        return False

    def _leave_meta_path(self):
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass


class _ReportingLoader:
    """A loader that tells its AfterImport when executing a module starts
    and ends; every other attribute is the original loader's, and the module
    keeps the original as its loader."""

    def __init__(self, original, hook, is_package):
        self._original = original
        self._hook = hook
        self._is_package = is_package

    def __getattr__(self, name):
        return getattr(self._original, name)

    def create_module(self, spec):
        return self._original.create_module(spec)

    def exec_module(self, module):

        self._hook._exec_starts(self._is_package)
        try:
            self._original.exec_module(module)
        except BaseException:
            self._give_back_loader(module)
            self._hook._exec_ends(self._is_package, succeeded=False)
            raise
        self._give_back_loader(module)
        self._hook._exec_ends(self._is_package, succeeded=True)

    def _give_back_loader(self, module):
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self._original
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self._original
