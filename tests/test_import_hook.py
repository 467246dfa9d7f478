"""tfdtape.import_hook: a callback right after a package's first import,
held back while a module under the defer prefix is being imported. Packages
made up for each test stand in for TensorFlow and tfdtape."""

import importlib
import importlib.machinery
import sys
import textwrap
import threading

import pytest

from tfdtape import import_hook


@pytest.fixture
def packages(tmp_path, monkeypatch):
    """Writes packages from {relative path: source}; returns a function that
    does it, with tmp_path first on sys.path and the made-up modules
    forgotten afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    written = []

    def write(files):
        for relative, source in files.items():
            path = tmp_path / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(source))
            written.append(relative.split("/")[0].removesuffix(".py"))
        importlib.invalidate_caches()

    yield write
    for name in list(sys.modules):
        if name.split(".")[0] in written:
            del sys.modules[name]
    sys.meta_path[:] = [finder for finder in sys.meta_path
                        if not isinstance(finder, import_hook.AfterImport)]


def seen_by(calls, name, attribute):
    """A callback recording `attribute` of module `name` as it is then."""
    return lambda: calls.append(getattr(sys.modules[name], attribute, "missing"))


def started(callback, defer_prefix="fakehelper."):
    """An AfterImport of `fakepkg` calling `callback`, started."""
    hook = import_hook.AfterImport("fakepkg", callback, defer_prefix=defer_prefix)
    hook.start()
    return hook


def test_calls_back_once_right_after_the_package_init(packages):
    packages({"fakepkg/__init__.py": "STARTED = True\nREADY = True\n"})
    calls = []
    hook = started(seen_by(calls, "fakepkg", "READY"))
    assert hook in sys.meta_path and calls == []
    import fakepkg
    assert calls == [True] and hook not in sys.meta_path
    assert type(fakepkg.__loader__) is importlib.machinery.SourceFileLoader
    assert fakepkg.__spec__.loader is fakepkg.__loader__
    importlib.reload(fakepkg)
    assert calls == [True]


def test_calls_back_at_start_when_the_package_is_already_imported(packages):
    packages({"fakepkg/__init__.py": "READY = True\n"})
    importlib.import_module("fakepkg")
    calls = []
    hook = started(seen_by(calls, "fakepkg", "READY"))
    assert calls == [True] and hook not in sys.meta_path


def test_waits_while_a_deferring_module_is_being_imported(packages):
    packages({
        "fakepkg/__init__.py": "READY = True\n",
        "fakehelper/__init__.py": "",
        "fakehelper/user.py": "import fakepkg\nfrom fakehelper import inner\n"
                              "DONE = True\n",
        "fakehelper/inner.py": "import fakepkg\n",
    })
    calls = []
    started(seen_by(calls, "fakehelper.user", "DONE"))
    importlib.import_module("fakehelper.user")
    assert calls == [True]
    for name in ("fakehelper.user", "fakehelper.inner"):
        assert type(sys.modules[name].__loader__) is (
            importlib.machinery.SourceFileLoader)


def test_control_without_the_defer_prefix_the_call_comes_mid_import(packages):
    packages({
        "fakepkg/__init__.py": "READY = True\n",
        "fakehelper/__init__.py": "",
        "fakehelper/user.py": "import fakepkg\nDONE = True\n",
    })
    calls = []
    started(seen_by(calls, "fakehelper.user", "DONE"),
            defer_prefix="someone_else.")
    importlib.import_module("fakehelper.user")
    assert calls == ["missing"]


def test_stop_before_the_import_means_no_call(packages):
    packages({"fakepkg/__init__.py": "READY = True\n"})
    calls = []
    hook = started(lambda: calls.append(1))
    hook.stop()
    importlib.import_module("fakepkg")
    assert calls == [] and hook not in sys.meta_path


def test_a_failed_package_import_calls_back_on_the_import_that_works(packages):
    packages({"fakepkg/__init__.py": "import os\n"
                                     "if os.environ.get('FAKEPKG_FAIL'):\n"
                                     "    raise ImportError('not now')\n"
                                     "READY = True\n"})
    calls = []
    hook = started(seen_by(calls, "fakepkg", "READY"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FAKEPKG_FAIL", "1")
        with pytest.raises(ImportError, match="not now"):
            importlib.import_module("fakepkg")
    assert calls == [] and hook in sys.meta_path
    importlib.import_module("fakepkg")
    assert calls == [True]


def test_the_callbacks_exception_fails_the_import_that_triggered_it(packages):
    packages({"fakepkg/__init__.py": "READY = True\n"})

    calls = []

    def refuse():
        calls.append("refused")
        raise RuntimeError("refused")

    hook = started(refuse)
    with pytest.raises(RuntimeError, match="refused"):
        importlib.import_module("fakepkg")
    assert hook not in sys.meta_path
    importlib.import_module("fakepkg")  # the failed import left nothing behind
    assert calls == ["refused"]


def test_threads_importing_together_get_one_call(packages):
    packages({"fakepkg/__init__.py": "import time\ntime.sleep(0.2)\nREADY = True\n"})
    calls = []
    started(seen_by(calls, "fakepkg", "READY"))
    seen = []

    def work():
        import fakepkg
        seen.append((fakepkg.READY, len(calls)))  # called back before

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == [True] and seen == [(True, 1)] * 4


@pytest.mark.parametrize("ahead", [True, False], ids=["ahead", "behind"])
def test_a_finder_that_asks_every_finder_does_not_loop(packages, ahead):
    packages({"fakepkg/__init__.py": "READY = True\n"})

    class AskEveryone:
        def find_spec(self, name, path=None, target=None):
            for finder in sys.meta_path:
                if finder is not self and hasattr(finder, "find_spec"):
                    spec = finder.find_spec(name, path, target)
                    if spec is not None:
                        return spec
            return None

    asker = AskEveryone()
    sys.meta_path.insert(0, asker)
    calls = []
    started(seen_by(calls, "fakepkg", "READY"))
    if ahead:  # start() put the hook first: move the asker ahead of it
        sys.meta_path.remove(asker)
        sys.meta_path.insert(0, asker)
    try:
        importlib.import_module("fakepkg")
    finally:
        sys.meta_path.remove(asker)
    assert calls == [True]
