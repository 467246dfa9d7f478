"""pytest plugin shipped with tfdtape (entry point `pytest11`).

Fixtures for downstream tests:
- `virtual_cpus`: names of n logical CPU devices (n from the
  `tfdtape_replicas(n)` marker, else the `tfdtape_replicas` ini option, else 4);
- `mirrored_strategy`: a MirroredStrategy over them;
- `tfdtape_installed`: tfdtape installed for the test, the previous state after;
- `pre_seed`: TensorFlow as before the commit for the test (the control).

`--tfdtape-report PATH` installs tfdtape for the whole session, records what
the gradient tapes did (as `python -m tfdtape run` does), writes the JSON
report to PATH and the summary at the end of the terminal report.

Loading the plugin imports neither TensorFlow nor tfdtape: pytest loads it in
every run of the environment, so the imports wait until a fixture asks.
"""

import importlib
import os
import sys

import pytest

DEFAULT_REPLICAS = 4


def pytest_addoption(parser):
    parser.addini("tfdtape_replicas",
                  "logical CPU devices for tfdtape's virtual_cpus fixture "
                  f"(default {DEFAULT_REPLICAS})", default=str(DEFAULT_REPLICAS))
    parser.addoption(
        "--tfdtape-report", metavar="PATH", default=None,
        help="install tfdtape for the session and write what the gradient "
             "tapes did to PATH (JSON, as `python -m tfdtape run --json`)")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "tfdtape_replicas(n): logical CPU devices the test needs "
        "(one layout per process)")
    path = config.getoption("tfdtape_report", None)
    if path is not None:
        config.pluginmanager.register(SessionReport(path, config.invocation_params.args),
                                      "tfdtape-session-report")


class SessionReport:
    """`--tfdtape-report PATH`: a recorder open for the whole session."""

    def __init__(self, path, arguments):
        command_line = importlib.import_module("tfdtape.cli.command_line")
        try:
            command_line.check_output_path(path, "--tfdtape-report")
        except command_line.UsageError as error:
            raise pytest.UsageError(f"tfdtape: {error}") from None
        self.path = path
        self.command = ["pytest", *map(str, arguments)]
        self.recorder = None
        self.report = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session):
        del session
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        importlib.import_module("tfdtape.patching").install()
        self.recorder = importlib.import_module("tfdtape.cli.event_counts").EventCounts()
        importlib.import_module("tfdtape.events").open_sink(self.recorder)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session, exitstatus):
        del session
        importlib.import_module("tfdtape.events").close_sink(self.recorder)
        run_report = importlib.import_module("tfdtape.cli.run_report")
        snapshot = self.recorder.snapshot()
        self.report = run_report.build(
            snapshot, self.command, int(exitstatus), installed=True, task=None,
            incomplete_reason=importlib.import_module(
                "tfdtape.cli.event_counts").incomplete_reason(snapshot))
        run_report.write_json(self.path, self.report)

    def pytest_terminal_summary(self, terminalreporter):
        if self.report is None:
            return
        terminalreporter.section("tfdtape")
        run_report = importlib.import_module("tfdtape.cli.run_report")
        terminalreporter.write_line(run_report.summary(self.report))
        terminalreporter.write_line(f"report written to {self.path}")


def _requested_replicas(request):
    marker = request.node.get_closest_marker("tfdtape_replicas")
    raw = marker.args[0] if marker and marker.args else request.config.getini(
        "tfdtape_replicas")
    try:
        replicas = int(raw)
    except (TypeError, ValueError):
        replicas = 0
    if replicas < 1 or isinstance(raw, bool):
        raise pytest.UsageError(
            f"tfdtape: tfdtape_replicas must be a positive integer, found {raw!r}")
    return replicas


def _testing():
    """tfdtape.testing, imported without installing tfdtape: a fixture that
    only needs devices or a strategy must leave TensorFlow as it was (an
    `import tfdtape` of the test's own still installs)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if "tfdtape" in sys.modules:
        return importlib.import_module("tfdtape.testing")
    saved = os.environ.get("TFDTAPE_AUTOINSTALL")
    os.environ["TFDTAPE_AUTOINSTALL"] = "0"
    try:
        return importlib.import_module("tfdtape.testing")
    finally:
        if saved is None:
            del os.environ["TFDTAPE_AUTOINSTALL"]
        else:
            os.environ["TFDTAPE_AUTOINSTALL"] = saved


@pytest.fixture
def virtual_cpus(request):
    """Names of the logical CPU devices this process is split into."""
    return _testing().virtual_cpus(_requested_replicas(request))


@pytest.fixture
def mirrored_strategy(virtual_cpus):
    """A tf.distribute.MirroredStrategy over `virtual_cpus`."""
    tf = importlib.import_module("tensorflow")
    return tf.distribute.MirroredStrategy(virtual_cpus)


@pytest.fixture
def tfdtape_installed():
    """tfdtape installed for the test; the previous state restored after."""
    patching = importlib.import_module("tfdtape.patching")
    with patching.patched():
        yield


@pytest.fixture
def pre_seed():
    """TensorFlow as before the commit for the test (native resolver off,
    tfdtape uninstalled); everything restored after."""
    with _testing().pre_seed():
        yield
