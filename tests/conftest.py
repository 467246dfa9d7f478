"""Test session set-up: one device layout (4 virtual CPUs) for the process.

TensorFlow fixes its logical devices when its runtime starts, so the layout is
chosen here, once; tests that need another layout run in a subprocess.

The version stages' options (tests/release_selection.py): `--per-release`
runs the tests marked `per_release`, thinned to every value of every
parameter; `--record-exercise DIR` records which of tfdtape's functions and
compat accessors the process ran (tests/exercise_recorder.py);
`--exercised-data DIR` runs tests/test_release_rule.py's proof on such
records (deselected without it).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pathlib

import pytest
import tensorflow as tf

import exercise_recorder
import release_selection
import tfdtape
from tfdtape import testing

REPLICAS = 4
DEVICES = testing.virtual_cpus(REPLICAS)


def pytest_addoption(parser):
    parser.addoption("--fuzz-cases", type=int, default=None,
                     help="generated programs per device layout "
                     "(tests/test_generated_programs.py; default CI's)")
    parser.addoption("--horovod-seed", type=int, default=None,
                     help="the generated Horovod programs' seed "
                     "(tests/test_generated_horovod.py; default CI's)")
    parser.addoption("--horovod-cases", type=int, default=None,
                     help="generated Horovod cases per launch (default CI's)")
    parser.addoption("--fault-seed", type=int, default=None,
                     help="the generated faults' seed (tests/test_generated_faults.py; "
                     "default CI's)")
    parser.addoption("--fault-cases", type=int, default=None,
                     help="generated fault cases (default CI's)")
    parser.addoption("--fuzz-seed", type=int, default=None,
                     help="the generated programs' seed (default CI's)")
    parser.addoption("--per-release", action="store_true",
                     help="only the tests marked per_release, each parametrized "
                     "test thinned to every value of every parameter (the "
                     "version stages of CI)")
    parser.addoption("--record-exercise", type=pathlib.Path, default=None,
                     metavar="DIR", help="write which of tfdtape's functions "
                     "and compat accessors this run ran to DIR")
    parser.addoption("--exercised-data", type=pathlib.Path, default=None,
                     metavar="DIR", help="run the proof that the records in "
                     "DIR (--record-exercise) cover every patch target and "
                     "compat accessor")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "pip_installed: needs tfdtape pip-installed (its pytest11 "
        "entry point); Bazel targets deselect it")
    config.addinivalue_line(
        "markers", "cluster: worker processes on loopback; README's test "
        "command runs these alone, after the others (which run in parallel)")
    config.addinivalue_line(
        "markers", f"{release_selection.MARKER}: the outcome can depend on the "
        "TensorFlow or Keras release; the version stages run it "
        "(--per-release)")
    config.addinivalue_line(
        "markers", "exercise_proof: reads --exercised-data; deselected without it")
    config.addinivalue_line(
        "markers", "slow: Horovod's own test files (tests/test_horovod_suite.py), run "
        "where TFDTAPE_HOROVOD_SOURCE names a Horovod checkout")
    if config.getoption("record_exercise") is not None:
        exercise_recorder.start()
        os.environ[exercise_recorder.ENVIRONMENT] = str(
            config.getoption("record_exercise").resolve())


def pytest_collection_modifyitems(config, items):
    deselected = []
    if config.getoption("exercised_data") is None:
        deselected += [item for item in items
                       if item.get_closest_marker("exercise_proof")]
    elif not config.getoption("per_release"):
        deselected += [item for item in items
                       if not item.get_closest_marker("exercise_proof")]
    if config.getoption("per_release"):
        kept, thinned = release_selection.select(
            [item for item in items if item not in deselected])
        deselected += thinned
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        dropped = set(deselected)
        items[:] = [item for item in items if item not in dropped]


def pytest_runtest_setup(item):
    if item.config.getoption("record_exercise") is not None:
        exercise_recorder.refresh()


def pytest_sessionfinish(session):
    directory = session.config.getoption("record_exercise")
    if directory is not None:
        worker = getattr(session.config, "workerinput", {}).get("workerid", "main")
        exercise_recorder.write(directory, f"pytest-{worker}")


@pytest.fixture(scope="session")
def strategy():
    """MirroredStrategy over the session's 4 virtual CPUs."""
    return tf.distribute.MirroredStrategy(DEVICES)


@pytest.fixture(scope="session")
def strategy_of_two():
    """MirroredStrategy over the session's first 2 virtual CPUs, reducing
    through one device: with TensorFlow's default collective all-reduce, its
    collective group would clash with the 4-replica strategy's (both take
    group key 1: "joining a group with size 2, but that group has size 4")."""
    return tf.distribute.MirroredStrategy(
        DEVICES[:2], cross_device_ops=tf.distribute.ReductionToOneDevice())


@pytest.fixture(params=testing.CONFIGURATIONS)
def configuration(request):
    """Runs the test in each configuration; yields the configuration's name."""
    with testing.configuration(request.param):
        yield request.param


@pytest.fixture(autouse=True)
def state_is_restored():
    """Every test leaves tfdtape installed and TensorFlow's resolver registered."""
    assert tfdtape.is_installed()
    assert testing.native_resolver_is_registered()
    yield
    assert tfdtape.is_installed(), "a test left tfdtape uninstalled"
    assert testing.native_resolver_is_registered(), (
        "a test left TensorFlow's native resolver unregistered")
