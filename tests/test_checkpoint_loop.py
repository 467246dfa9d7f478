"""A custom loop survives a restart: TensorFlow's multi-worker tutorial's
`tf.train.CheckpointManager` with the tape around `strategy.run`
(tests/checkpoint_loop_process.py) on 2 launched processes. Rank 1 ends in
epoch 2, `tfdtape launch --max-restarts 1` starts the job again, it
restores the chief's checkpoint of epoch 2, runs epochs 2 and 3 only and
ends with the uninterrupted job's variables on every process, bitwise;
the job is one device on the global batches."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import restart_jobs

SCRIPT = str(pathlib.Path(__file__).parent / "checkpoint_loop_process.py")
TIMEOUT_SECONDS = 240

pytestmark = pytest.mark.cluster


def test_a_custom_loop_resumes_from_the_chiefs_checkpoint_after_a_restart(
        tmp_path, tmp_path_factory):
    for name in ("restarted", "alone"):
        (tmp_path / name).mkdir()
    uninterrupted = restart_jobs.uninterrupted("loop", tmp_path_factory)[1].ranks
    job = restart_jobs.launch("loop", tmp_path / "restarted", restarts=1,
                              env={"FAULTS": "0:1:batch:2:exit"})
    assert job.status == 0, job.stderr[-3000:]
    restarted, stderr = job.ranks, job.stderr
    assert "tfdtape launch: rank 1 exited with status 3;" in stderr
    assert "restarting every process (attempt 1 of 1)" in stderr
    for rank in (0, 1):
        assert uninterrupted[rank]["epochs"] == [0, 1, 2, 3]
        assert restarted[rank]["epochs"] == [2, 3]
        assert restarted[rank]["variables"] == uninterrupted[0]["variables"]
        assert uninterrupted[rank]["variables"] == uninterrupted[0]["variables"]
    alone = subprocess.run([sys.executable, SCRIPT, str(tmp_path / "alone")],
                           env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
                           capture_output=True, text=True, timeout=TIMEOUT_SECONDS)
    assert alone.returncode == 0, alone.stderr[-3000:]
    reference = json.loads(alone.stdout.splitlines()[-1])
    for found, wanted in zip(uninterrupted[0]["variables"], reference["variables"],
                             strict=True):
        np.testing.assert_allclose(found, wanted, rtol=1e-5, atol=1e-6)
    # the chief's checkpoint (max_to_keep=1); the other worker removed its own
    assert sorted(os.listdir(tmp_path / "restarted")) == [
        "checkpoint", "ckpt-4.data-00000-of-00001", "ckpt-4.index"]
