"""Test session set-up: one device layout (4 virtual CPUs) for the process.

TensorFlow fixes its logical devices when its runtime starts, so the layout is
chosen here, once; tests that need another layout run in a subprocess.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pytest
import tensorflow as tf

import tfdtape
from tfdtape import testing

REPLICAS = 4
DEVICES = testing.virtual_cpus(REPLICAS)


def pytest_addoption(parser):
    parser.addoption("--fuzz-cases", type=int, default=None,
                     help="generated programs per device layout "
                     "(tests/test_generated_programs.py; default CI's)")
    parser.addoption("--fuzz-seed", type=int, default=None,
                     help="the generated programs' seed (default CI's)")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "pip_installed: needs tfdtape pip-installed (its pytest11 "
        "entry point); Bazel targets deselect it")
    config.addinivalue_line(
        "markers", "cluster: worker processes on loopback; README's test "
        "command runs these alone, after the others (which run in parallel)")


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
