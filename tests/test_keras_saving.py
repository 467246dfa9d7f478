"""Keras 3's saving on several workers (tfdtape.keras3_saving): one shared
directory for the job, the chief's files written once and whole, a killed
process resumed from the last backup with nothing lost.

The cluster tests launch tests/keras_saving_process.py with `python -m
tfdtape launch` on loopback: a Keras 3 `fit` with BackupAndRestore and two
ModelCheckpoints on one directory, then `model.save`, `save_weights` and
`export`. Launched again by hand and restarted by `--max-restarts`.
Against the uninterrupted job (bitwise, every variable of the
model and the optimizer, every worker) and one device on the global batch.
Stock TensorFlow cannot run Keras 3's `fit` on several workers at all
(tests/test_keras_multi_worker.py), so the control is the same job with
Keras's own saving put back (`--stock-saving`): a chief killed while
writing its backup leaves a file that fails to load.

The in-process tests check the writes themselves on a stand-in model whose
strategy spans several workers.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys
import types

import numpy as np
import pytest
import tensorflow as tf

import restart_jobs
from keras_models import is_keras3
from tfdtape import keras3_saving
from tfdtape import process_job
from tfdtape import testing

SCRIPT = str(pathlib.Path(__file__).parent / "keras_saving_process.py")
TIMEOUT_SECONDS = 240
FINAL_FILES = {"best.keras", "ckpt-01.weights.h5", "ckpt-02.weights.h5", "ckpt-03.weights.h5",
               "ckpt-04.weights.h5", "exported", "final.keras", "final.weights.h5"}
_found = {}

keras3_only = pytest.mark.skipif(not is_keras3(tf.keras),
                                 reason="Keras 3's saving (tf.keras is Keras 2)")


def launch(directory, *arguments, processes=2, restarts=0, env=None):
    """keras_saving_process.py under `tfdtape launch`, TMPDIR beside
    `directory`; returns a restart_jobs.Job."""
    return restart_jobs.launch("fit", directory, *arguments, processes=processes,
                               restarts=restarts, env=env)


def reference(tmp_path_factory, legacy=False):
    """One process, no strategy, on the global batch: its JSON."""
    key = ("reference", legacy)
    if key not in _found:
        directory = tmp_path_factory.mktemp("reference")
        completed = subprocess.run(
            [sys.executable, SCRIPT, str(directory), *(["--legacy"] if legacy else [])],
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
                     TF_USE_LEGACY_KERAS="1" if legacy else "0"),
            capture_output=True, text=True, timeout=TIMEOUT_SECONDS)
        assert completed.returncode == 0, completed.stderr[-3000:]
        _found[key] = json.loads(completed.stdout.splitlines()[-1])
    return _found[key]


def uninterrupted(tmp_path_factory):
    """The 2-process job on one shared directory, never interrupted."""
    return restart_jobs.uninterrupted("fit", tmp_path_factory)


def assert_finished_like(job, expected, epochs, processes=2):
    """Every rank ran `epochs` and holds `expected`'s variables, bitwise."""
    assert job.status == 0, job.stderr[-3000:]
    assert sorted(job.ranks) == list(range(processes))
    for rank, result in job.ranks.items():
        assert result["epochs"] == epochs, rank
        assert result["variables"] == expected["variables"], rank


def assert_close_to(result, expected):
    for found, wanted in zip(result["variables"], expected["variables"], strict=True):
        np.testing.assert_allclose(found, wanted, rtol=1e-5, atol=1e-6)


def assert_nothing_left(directory, written=None):
    """`written` (the job's directory) holds the final files only, and
    nothing of tfdtape's is left in it or in the processes' TMPDIR."""
    assert set(os.listdir(written or directory)) == FINAL_FILES
    temporary = restart_jobs.temporary_of(directory)
    assert [p.name for p in temporary.iterdir() if p.name.startswith("tfdtape-")] == []


@keras3_only
@pytest.mark.cluster
def test_one_shared_directory_gets_the_chiefs_files_once_and_whole(tmp_path_factory):
    directory, job = uninterrupted(tmp_path_factory)
    expected = job.ranks[0]
    assert_finished_like(job, expected, [0, 1, 2, 3])
    assert_close_to(expected, reference(tmp_path_factory))
    assert_nothing_left(directory)
    import keras
    model = keras.saving.load_model(directory / "final.keras")
    weights = [np.asarray(w).tolist() for w in model.weights]
    assert weights == expected["variables"][:len(weights)]
    loaded = keras.saving.load_model(directory / "best.keras")
    loaded.load_weights(directory / "ckpt-04.weights.h5")
    assert [np.asarray(w).tolist() for w in loaded.weights] == weights
    loaded.load_weights(directory / "final.weights.h5")
    assert [np.asarray(w).tolist() for w in loaded.weights] == weights
    assert (directory / "exported" / "saved_model.pb").is_file()


@keras3_only
@pytest.mark.cluster
def test_max_restarts_resumes_a_chief_killed_mid_epoch(tmp_path, tmp_path_factory):
    _, expected = uninterrupted(tmp_path_factory)
    directory = tmp_path / "job"
    directory.mkdir()
    job = launch(directory, "--die", "0:1:kill", restarts=1)
    assert "tfdtape launch: rank 0 exited with status 137;" in job.stderr, job.stderr[-3000:]
    assert "restarting every process (attempt 1 of 1)" in job.stderr
    assert_finished_like(job, expected.ranks[0], [1, 2, 3])
    assert_nothing_left(directory)


@keras3_only
@pytest.mark.cluster
def test_a_job_restarted_after_its_fit_ended_does_not_train_again(
        tmp_path, tmp_path_factory):
    """Issue 51: a process that dies after `fit` (and the saves) ended gets
    the launch restarted; the new attempt resumes at the ended fit's end:
    no epoch trained again, the uninterrupted job's weights, nothing left
    of the backup. The control (no copy kept) trains all 4 epochs again."""
    _, expected = uninterrupted(tmp_path_factory)
    directory = tmp_path / "job"
    directory.mkdir()
    job = launch(directory, "--die", "0:0:after", restarts=1)
    assert "tfdtape launch: rank 0 exited with status 3;" in job.stderr, job.stderr
    assert "trains no epoch again" in job.stderr
    assert_finished_like(job, expected.ranks[0], [])
    assert_nothing_left(directory)
    control = tmp_path / "control"
    control.mkdir()
    job = launch(control, "--die", "0:0:after", "--forget-finished", restarts=1)
    assert_finished_like(job, expected.ranks[0], [0, 1, 2, 3])


@keras3_only
@pytest.mark.cluster
def test_a_chief_killed_while_writing_resumes_from_the_last_whole_backup(
        tmp_path, tmp_path_factory):
    _, expected = uninterrupted(tmp_path_factory)
    directory = tmp_path / "job"
    directory.mkdir()
    job = launch(directory, "--die", "0:1:write", restarts=1)
    # the backup of epoch 1 was never committed: the job resumes at epoch 1
    assert_finished_like(job, expected.ranks[0], [1, 2, 3])
    assert_nothing_left(directory)


@keras3_only
@pytest.mark.cluster
def test_without_tfdtapes_saving_a_chief_killed_while_writing_cannot_resume(tmp_path):
    # each worker on a directory of its own: Keras's own writes race on a shared one
    directory = tmp_path / "job"
    directory.mkdir()
    job = launch(directory, "--stock-saving", "--per-rank", "--die", "0:1:write", restarts=1)
    assert job.status == 1
    assert "restarting every process (attempt 1 of 1)" in job.stderr
    assert "[0]<stderr>:OSError: Unable to synchronously open file" in job.stderr, \
        job.stderr[-3000:]


@keras3_only
@pytest.mark.cluster
def test_workers_on_directories_of_their_own_resume_from_the_chiefs_when_launched_again(
        tmp_path, tmp_path_factory):
    _, expected = uninterrupted(tmp_path_factory)
    directory = tmp_path / "job"
    directory.mkdir()
    ended = launch(directory, "--per-rank", "--die", "1:2:exit")
    assert ended.status == 3
    assert ended.ranks == {}
    assert os.listdir(directory / "rank-1") == []  # only the chief writes
    backup = directory / "rank-0" / "backup"
    assert sorted(os.listdir(backup)) == ["latest.weights.h5", "training_metadata.json"]
    metadata = json.loads((backup / "training_metadata.json").read_text())
    assert metadata == {"epoch": 2, "batch": 0}
    again = launch(directory, "--per-rank")  # by hand
    assert_finished_like(again, expected.ranks[0], [2, 3])
    assert_nothing_left(directory, directory / "rank-0")
    assert os.listdir(directory / "rank-1") == []


@pytest.mark.per_release(False)
@keras3_only
@pytest.mark.cluster
def test_three_workers_resume_a_killed_worker_like_one_device(tmp_path, tmp_path_factory):
    directory = tmp_path / "job"
    directory.mkdir()
    job = launch(directory, "--die", "2:2:kill", processes=3, restarts=1)
    assert_finished_like(job, job.ranks[0], [2, 3], processes=3)
    assert_close_to(job.ranks[0], reference(tmp_path_factory))
    assert_nothing_left(directory)


@pytest.mark.cluster
def test_tf_keras_keeps_its_own_saving_under_tfdtape(tmp_path, tmp_path_factory):
    directory = tmp_path / "job"
    directory.mkdir()
    legacy = {"TF_USE_LEGACY_KERAS": "1"}
    ended = launch(directory, "--legacy", "--die", "1:2:exit", env=legacy)
    assert ended.status == 3
    again = launch(directory, "--legacy", env=legacy)
    assert again.status == 0, again.stderr[-3000:]
    assert [again.ranks[rank]["epochs"] for rank in (0, 1)] == [[2, 3], [2, 3]]
    assert again.ranks[0]["variables"] == again.ranks[1]["variables"]
    assert_close_to(again.ranks[0], reference(tmp_path_factory, legacy=True))
    # tf_keras leaves its backup directory empty, on one process too
    assert set(os.listdir(directory)) == FINAL_FILES - {"exported"} | {"backup"}
    assert os.listdir(directory / "backup") == []


def stand_in(workers, chief=True):
    """An object with a strategy of `workers` workers, as the saving
    functions see a model (one worker: not in multi-worker mode)."""
    extended = types.SimpleNamespace(_in_multi_worker_mode=lambda: workers > 1,
                                     should_checkpoint=chief)
    return types.SimpleNamespace(distribute_strategy=types.SimpleNamespace(extended=extended))


def writing(content, fail_after=None):
    """A stand-in for Keras's `save_weights`: writes `content` at the path
    it gets, or part of it and raises; records the paths."""
    paths = []

    def save_weights(model, filepath, overwrite=True, max_shard_size=None, **kwargs):
        paths.append(str(filepath))
        with open(filepath, "wb") as file:
            file.write(content[:fail_after])
        if fail_after is not None:
            raise OSError("disk full")
        return "written"

    save_weights.paths = paths
    return save_weights


def test_the_chief_writes_whole_or_leaves_the_last_good_file(tmp_path):
    target = tmp_path / "model.weights.h5"
    save = keras3_saving.make_save_weights(writing(b"first"))
    assert save(stand_in(2), str(target)) == "written"
    assert target.read_bytes() == b"first"
    broken = writing(b"second", fail_after=3)
    with pytest.raises(OSError, match="disk full"):
        keras3_saving.make_save_weights(broken)(stand_in(2), target)
    assert broken.paths[0] != str(target)  # staged beside it, never in place
    assert os.path.dirname(broken.paths[0]) != str(tmp_path)
    assert target.read_bytes() == b"first"
    assert os.listdir(tmp_path) == ["model.weights.h5"]


def test_the_other_workers_write_nothing_at_the_path_and_leave_nothing(tmp_path):
    target = tmp_path / "model.weights.h5"
    save = writing(b"other")
    assert keras3_saving.make_save_weights(save)(stand_in(2, chief=False), target) == "written"
    assert os.listdir(tmp_path) == []
    assert os.path.basename(save.paths[0]) == "model.weights.h5"
    assert not os.path.exists(os.path.dirname(save.paths[0]))  # its private directory, removed


def test_one_worker_and_a_refused_overwrite_write_as_keras_does(tmp_path):
    target = tmp_path / "model.weights.h5"
    save = writing(b"one")
    keras3_saving.make_save_weights(save)(stand_in(1), target)
    keras3_saving.make_save_weights(save)(stand_in(2), target, overwrite=False)
    assert save.paths == [str(target), str(target)]  # Keras asks before overwriting


def test_a_directory_artifact_replaces_the_last_one_whole(tmp_path):
    target = tmp_path / "exported"
    target.mkdir()
    (target / "old.pb").write_bytes(b"old")

    def export(self, filepath, format="tf_saved_model", verbose=None, input_signature=None,
               **kwargs):
        os.makedirs(filepath)
        pathlib.Path(filepath, "saved_model.pb").write_bytes(b"new")

    keras3_saving.make_export(export)(stand_in(2), str(target))
    assert os.listdir(target) == ["saved_model.pb"]
    assert os.listdir(tmp_path) == ["exported"]


@pytest.mark.parametrize("staged, kept", [
    (["latest.weights.h5", "training_metadata.json"], b'{"epoch": 1}'),  # not begun
    (["training_metadata.json"], b'{"epoch": 2}'),  # weights in place: metadata follows
    ([], b'{"epoch": 1}'),
])
def test_a_commit_a_killed_chief_left_is_finished_or_discarded(tmp_path, staged, kept):
    (tmp_path / "latest.weights.h5").write_bytes(b"weights")
    (tmp_path / "training_metadata.json").write_bytes(b'{"epoch": 1}')
    staging = tmp_path / keras3_saving.STAGING
    staging.mkdir()
    for name in staged:
        (staging / name).write_bytes(b"partial" if name.endswith(".h5") else b'{"epoch": 2}')
    keras3_saving.finish_commit(str(tmp_path), "latest.weights.h5", "training_metadata.json")
    assert sorted(os.listdir(tmp_path)) == ["latest.weights.h5", "training_metadata.json"]
    assert (tmp_path / "training_metadata.json").read_bytes() == kept
    assert (tmp_path / "latest.weights.h5").read_bytes() == b"weights"


def fit_and_save(keras, directory):
    """A one-process `fit` with the callbacks, then every save: the files'
    names and the final weights."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    x = np.arange(16, dtype=np.float32).reshape(8, 2) / 16
    callbacks = [keras.callbacks.BackupAndRestore(str(directory / "backup")),
                 keras.callbacks.ModelCheckpoint(str(directory / "ckpt-{epoch}.weights.h5"),
                                                 save_weights_only=True),
                 keras.callbacks.ModelCheckpoint(str(directory / "best.keras"),
                                                 monitor="loss", save_best_only=True)]
    model.fit(x, x[:, :1], batch_size=4, epochs=2, shuffle=False, verbose=0,
              callbacks=callbacks)
    model.save(directory / "final.keras")
    keras.saving.save_weights(model, directory / "final.weights.h5")
    model.export(str(directory / "exported"), verbose=False)
    loaded = keras.saving.load_model(directory / "final.keras")
    return sorted(os.listdir(directory)), [np.asarray(w).tolist() for w in loaded.weights]


@pytest.mark.per_release
@keras3_only
def test_one_worker_saves_exactly_as_stock_keras_does(tmp_path):
    import keras
    keras.utils.set_random_seed(3)
    (tmp_path / "stock").mkdir()
    with testing.stock():
        stock = fit_and_save(keras, tmp_path / "stock")
    keras.utils.set_random_seed(3)
    (tmp_path / "tfdtape").mkdir()
    saved = fit_and_save(keras, tmp_path / "tfdtape")
    assert saved == stock
    assert saved[0] == ["best.keras", "ckpt-1.weights.h5", "ckpt-2.weights.h5", "exported",
                        "final.keras", "final.weights.h5"]


def dead_process_id():
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True)
    return int(finished.stdout)


def test_what_a_killed_writer_left_is_removed_at_the_next_write(tmp_path):
    host = socket.gethostname()
    dead = tmp_path / f".tfdtape-staging-{host}-{dead_process_id()}-abc"
    alive = tmp_path / f".tfdtape-staging-{host}-{os.getppid()}-abc"
    for left in (dead, alive):
        left.mkdir()
        (left / "model.weights.h5").write_bytes(b"partial")
    keras3_saving.make_save_weights(writing(b"whole"))(stand_in(2), tmp_path / "model.weights.h5")
    assert sorted(os.listdir(tmp_path)) == [alive.name, "model.weights.h5"]


def test_every_worker_stops_where_keras_stops(tmp_path):
    missing = tmp_path / "no" / "such" / "model.weights.h5"
    for chief in (True, False):
        save = writing(b"x")
        with pytest.raises(FileNotFoundError):
            keras3_saving.make_save_weights(save)(stand_in(2, chief), missing)
        assert save.paths == [str(missing)]
    (tmp_path / "exported").write_bytes(b"a file where a directory goes")

    def export(self, filepath, format="tf_saved_model", verbose=None, input_signature=None,
               **kwargs):
        os.makedirs(filepath)

    for chief in (True, False):
        with pytest.raises(NotADirectoryError):
            keras3_saving.make_export(export)(stand_in(2, chief), str(tmp_path / "exported"))
    assert (tmp_path / "exported").read_bytes() == b"a file where a directory goes"


def test_a_remote_save_is_unzipped_on_every_worker_as_keras_decides_it(tmp_path):
    calls = []

    def save_model(model, filepath, overwrite=True, zipped=None, **kwargs):
        calls.append((os.path.basename(filepath), zipped))

    for chief in (True, False):
        keras3_saving.make_save_model(save_model)(stand_in(2, chief), "hf://user/repo")
    assert calls == [("repo", False), ("repo", False)]


def test_a_backup_copy_keeps_the_files_mode(tmp_path):
    source = tmp_path / "latest.weights.h5"
    source.write_bytes(b"weights")
    source.chmod(0o644)
    keras3_saving._copied_whole(str(source), str(tmp_path / "latest.weights.h5.bkp"))
    assert (tmp_path / "latest.weights.h5.bkp").stat().st_mode & 0o777 == 0o644
    assert sorted(os.listdir(tmp_path)) == ["latest.weights.h5", "latest.weights.h5.bkp"]


def test_in_a_horovod_job_rank_0_writes_and_the_others_write_nothing(tmp_path):
    target = tmp_path / "model.weights.h5"
    alone = types.SimpleNamespace(distribute_strategy=None)  # Horovod: no strategy
    try:
        for rank, content in ((1, b"rank 1"), (0, b"rank 0")):
            process_job.register(process_job.ProcessJob(rank=rank, size=2))
            keras3_saving.make_save_weights(writing(content))(alone, target)
            assert os.listdir(tmp_path) == (["model.weights.h5"] if rank == 0 else [])
        assert target.read_bytes() == b"rank 0"
        process_job.register(process_job.ProcessJob(rank=1, size=1))  # a job of one
        keras3_saving.make_save_weights(writing(b"alone"))(alone, target)
        assert target.read_bytes() == b"alone"
    finally:
        process_job.register(None)


class _Backup:
    """The attributes of Keras 3's BackupAndRestore that
    keras3_finished_training reads."""

    def __init__(self, directory):
        self.backup_dir = str(directory)
        self.save_freq = "epoch"
        self._weights_path = str(directory / "latest.weights.h5")
        self._training_metadata_path = str(directory / "training_metadata.json")

    def write(self, text):
        os.makedirs(self.backup_dir, exist_ok=True)
        for path in (self._weights_path, self._training_metadata_path):
            with open(path, "w") as file:
                file.write(text)

    def read(self):
        with open(self._weights_path) as file:
            return file.read()


def test_each_fit_on_one_backup_directory_gets_its_own_copy(tmp_path, monkeypatch):
    """Found by the break-it review: a second `fit` on the same backup
    directory took the first one's copy in a restarted attempt (it trained
    nothing, or loaded another model's weights)."""
    import shutil
    import warnings

    from tfdtape import keras3_finished_training as finished
    monkeypatch.setenv("TFDTAPE_LAUNCH_DIR", str(tmp_path / "launch"))
    monkeypatch.setattr(finished, "_fits", {})
    directory = tmp_path / "backup"
    monkeypatch.setenv("TFDTAPE_RESTART_COUNT", "0")
    for text in ("first fit's end", "second fit's end"):  # attempt 0: both fits end
        backup = _Backup(directory)
        assert finished.restore(backup) is False  # the first attempt restores nothing
        backup.write(text)
        finished.remember(backup)
        shutil.rmtree(directory)  # as Keras deletes it
    monkeypatch.setenv("TFDTAPE_RESTART_COUNT", "1")
    monkeypatch.setattr(finished, "_fits", {})  # a new process
    found = []
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        for _ in range(3):
            backup = _Backup(directory)
            found.append(backup.read() if finished.restore(backup) else None)
            if os.path.exists(directory):
                shutil.rmtree(directory)
    assert found == ["first fit's end", "second fit's end", None]  # a third never ended
    assert [str(w.message).split(" backed up")[0] for w in warned] == [
        "tfdtape: fit number 1", "tfdtape: fit number 2"]


@keras3_only
def test_a_fit_after_a_resumed_fit_trains_its_own_epochs(tmp_path):
    """Keras keeps the epoch BackupAndRestore resumed a `fit` at on the
    model, and the next `fit` started there (training nothing): found by
    the break-it review, where a restarted launch's first `fit` resumed at
    its end. tfdtape clears it when the resumed `fit` ends."""
    import keras
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    features, labels = np.ones((4, 2), np.float32), np.ones((4, 1), np.float32)
    epochs = []

    class Count(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            epochs.append(epoch)

    backup = str(tmp_path / "backup")
    model.fit(features, labels, epochs=2, verbose=0, callbacks=[
        keras.callbacks.BackupAndRestore(backup, delete_checkpoint=False)])
    model.fit(features, labels, epochs=2, verbose=0,  # resumes at its end
              callbacks=[keras.callbacks.BackupAndRestore(backup), Count()])
    assert epochs == []
    model.fit(features, labels, epochs=2, verbose=0, callbacks=[Count()])
    assert epochs == [0, 1]
