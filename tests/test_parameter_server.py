"""ParameterServerStrategy (in-process cluster, in a subprocess).

Its variables are CachingVariables wrapping a ResourceVariable on the ps
task, with no back-reference from the inner variable; so in replica context
the tape watches the inner variable, in stock TensorFlow, with tfdtape, and
before the commit alike. tfdtape must not change that (a documented limit: the
container semantics do not reach this strategy's wrapper).
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

# Worker processes on loopback: they run alone, not beside other tests
# (README's test command runs the `cluster` tests in a pytest run of their own).
pytestmark = [pytest.mark.per_release, pytest.mark.cluster]

TESTS = pathlib.Path(__file__).parent


def test_tfdtape_matches_stock_tensorflow_on_parameter_servers():
    completed = subprocess.run(
        [sys.executable, str(TESTS / "parameter_server_process.py")],
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), capture_output=True,
        text=True, timeout=240)
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads(completed.stdout.strip().splitlines()[-1])
    assert sorted(results) == ["pre_seed", "stock", "tfdtape", "tfdtape_alone"]
    for configuration, observed in results.items():
        assert observed == {
            "variable": "CachingVariable",
            "replica_watched": [["ResourceVariable", False]],
            "replica_gradient": 6.0,
            "cross_watched": ["CachingVariable"],
            "cross_gradient": 6.0,
        }, configuration
