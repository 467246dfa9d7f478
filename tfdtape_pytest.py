"""pytest plugin shipped with tfdtape (entry point `pytest11`).

Fixtures for downstream tests:
- `virtual_cpus`: names of n logical CPU devices (n from the
  `tfdtape_replicas(n)` marker, else the `tfdtape_replicas` ini option, else 4);
- `mirrored_strategy`: a MirroredStrategy over them;
- `tfdtape_installed`: tfdtape installed for the test, the previous state after;
- `pre_seed`: TensorFlow as before the commit for the test (the control).

Loading the plugin imports neither TensorFlow nor tfdtape: pytest loads it in
every run of the environment, so the imports wait until a fixture asks.
"""

import importlib
import os

import pytest

DEFAULT_REPLICAS = 4


def pytest_addoption(parser):
    parser.addini("tfdtape_replicas",
                  "logical CPU devices for tfdtape's virtual_cpus fixture "
                  f"(default {DEFAULT_REPLICAS})", default=str(DEFAULT_REPLICAS))


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "tfdtape_replicas(n): logical CPU devices the test needs "
        "(one layout per process)")


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
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return importlib.import_module("tfdtape.testing")


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
