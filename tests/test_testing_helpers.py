"""tfdtape.testing: device layout and the configurations' exact states."""

import pytest
import tensorflow as tf

import tfdtape
from conftest import DEVICES
from tfdtape import testing

pytestmark = pytest.mark.per_release


def test_virtual_cpus_returns_the_layout_again():
    assert testing.virtual_cpus(4) == DEVICES
    assert DEVICES == [f"/device:CPU:{i}" for i in range(4)]


def test_virtual_cpus_refuses_another_layout_once_started():
    with pytest.raises(RuntimeError) as raised:
        testing.virtual_cpus(2)
    text = str(raised.value)
    assert text.startswith("tfdtape: cannot split the CPU into 2 logical devices "
                           "(tf.config.set_logical_device_configuration): "
                           "expected 2 logical CPUs, found 4 already configured")
    assert "run this layout in a fresh process" in text


@pytest.mark.parametrize("bad", [0, -1, 2.0, "4", True, None])
def test_virtual_cpus_rejects_bad_counts(bad):
    with pytest.raises(ValueError, match="expected a positive int"):
        testing.virtual_cpus(bad)


def test_mirrored_strategy_spans_the_virtual_cpus():
    strategy = testing.mirrored_strategy(4)
    assert isinstance(strategy, tf.distribute.MirroredStrategy)
    assert strategy.num_replicas_in_sync == 4


@pytest.mark.parametrize("name, installed, native", [
    ("stock", False, True),
    ("tfdtape", True, True),
    ("tfdtape_alone", True, False),
    ("pre_seed", False, False),
])
def test_configurations_set_and_restore_state(name, installed, native):
    with testing.configuration(name):
        assert tfdtape.is_installed() is installed
        assert testing.native_resolver_is_registered() is native
    assert tfdtape.is_installed() and testing.native_resolver_is_registered()


def test_pre_seed_nests_and_restores():
    with testing.tfdtape_alone():
        with testing.pre_seed():
            assert not tfdtape.is_installed()
            assert not testing.native_resolver_is_registered()
        assert tfdtape.is_installed()
        assert not testing.native_resolver_is_registered()


def test_unknown_configuration_is_refused():
    with pytest.raises(ValueError, match=(
            "expected one of stock, tfdtape, tfdtape_alone, pre_seed, "
            "found 'bogus'")):
        testing.configuration("bogus")


@pytest.mark.parametrize("outer", ["tfdtape_alone", "pre_seed"])
@pytest.mark.parametrize("inner", ["stock", "tfdtape"])
def test_a_configuration_with_the_resolver_on_nests_in_one_with_it_off(
        outer, inner):
    """Results cached under stock TensorFlow may first be asked for inside
    another configuration (tests run in any order under pytest-xdist)."""
    with testing.configuration(outer):
        assert not testing.native_resolver_is_registered()
        with testing.configuration(inner):
            assert testing.native_resolver_is_registered()
            assert tfdtape.is_installed() == (inner == "tfdtape")
        assert not testing.native_resolver_is_registered()
        assert tfdtape.is_installed() == (outer == "tfdtape_alone")
    assert testing.native_resolver_is_registered() and tfdtape.is_installed()
