"""Keras 3's saving on several workers: the chief writes, once and whole.

Under MultiWorkerMirroredStrategy every worker runs the same program and so
calls `model.save`, `model.save_weights`, `model.export` and the callbacks
that call them with the same paths. Keras 3 does nothing about it (tf_keras
did): on one shared directory the writes race (BackupAndRestore's
`makedirs` raises FileExistsError, h5py cannot lock the file). On a model
whose strategy spans several workers, tfdtape's versions make

- the chief (`strategy.extended.should_checkpoint`) write the real files:
  into a staging directory beside them first, then renamed into place, so
  a process killed while writing leaves the last good file where it was
  (local paths; a remote one is written as Keras writes it);
- every other worker write the same into a private temporary directory,
  removed right after: it runs the operations the chief runs, so any
  collective among them pairs up, and leaves nothing behind;
- BackupAndRestore commit the weights, then the metadata, out of a staging
  directory in the backup directory: a restart finds either the last
  commit or this one (`finish_commit` completes or discards what a killed
  chief left). The end-of-training deletion happens on the chief only. At
  the start of `fit` the chief reads the backup and every worker receives
  its files through the job's collectives (`tfdtape.worker_broadcast`),
  then restores from a private copy with Keras's own logic: workers whose
  disks are separate resume alike.

In a `tfdtape.horovod` job of several processes (`tfdtape.process_job`)
rank 0 is the chief and the writes are the same; the restore at the start
of `fit` is Keras's own on every process there (a Horovod program may give
BackupAndRestore to some ranks only, and a hand-over would wait for the
others), so its backup directory must be one every process reads.

Everywhere else (one worker, no strategy) Keras's functions run unchanged.
tf_keras keeps its own logic and is not touched. Keras is never imported
here.
"""

import contextlib
import errno
import functools
import os
import shutil
import socket
import sys
import tempfile
import threading
import typing
import warnings

from tensorflow.python.lib.io import file_io

from tfdtape import errors
from tfdtape import events
from tfdtape import keras3_finished_training
from tfdtape import process_job
from tfdtape import worker_broadcast
from tfdtape import workers

SAVING_MODULE = "keras.src.saving.saving_api"
API_MODULES = (SAVING_MODULE, "keras.saving", "keras.models",
               "keras._tf_keras.keras.saving", "keras._tf_keras.keras.models")
"""The modules that hold Keras 3's `save_model` and `save_weights`."""
SAVE_MODEL = ("save_model", ("model", "filepath", "overwrite", "zipped", "kwargs"))
SAVE_WEIGHTS = ("save_weights", ("model", "filepath", "overwrite", "max_shard_size", "kwargs"))
MODEL_MODULE = "keras.src.models.model"
EXPORT = ("export", ("self", "filepath", "format", "verbose", "input_signature",
                   "kwargs"))
BACKUP_MODULE = "keras.src.callbacks.backup_and_restore"
BACKUP_BEGIN = ("on_train_begin", ("self", "logs"))
BACKUP_SAVE = ("_save_model", ("self",))
BACKUP_END = ("on_train_end", ("self", "logs"))
CHECKPOINT_MODULE = "keras.src.callbacks.model_checkpoint"
CHECKPOINT_SAVE = ("_save_model", ("self", "epoch", "batch", "logs"))
WATCHED = (*API_MODULES, MODEL_MODULE, BACKUP_MODULE, CHECKPOINT_MODULE)
"""The modules whose loading brings patch targets (`tfdtape.late_imports`)."""

STAGING = ".tfdtape-commit"
"""The staging directory of a backup commit, inside the backup directory."""
_BACKUP_FILES = ("_weights_path", "_training_metadata_path", "_prev_weights_path",
                 "_prev_training_metadata_path")
"""BackupAndRestore's attributes holding its files' paths."""
_placement = threading.local()


def defined(module_name, class_name, attribute):
    """The class `class_name` of loaded module `module_name` if it defines
    `attribute`; else None."""
    module = sys.modules.get(module_name)
    found = None if module is None else vars(module).get(class_name)
    return found if isinstance(found, type) and attribute in vars(found) else None


def saving_modules(attribute):
    """The loaded modules of API_MODULES holding the saving module's
    `attribute` (or tfdtape's replacement of it)."""
    saving = sys.modules.get(SAVING_MODULE)
    if saving is None or attribute not in vars(saving):
        return []
    return [sys.modules[name] for name in API_MODULES if name in sys.modules
            and attribute in vars(sys.modules[name])]


def job_strategy(model):
    """The strategy of `model` where it spans several workers; else None."""
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is None or not workers.in_multi_worker_mode(strategy):
        return None
    return strategy


class Role(typing.NamedTuple):
    """Where this process stands in the job that trains a model."""
    chief: bool
    strategy: object
    """The model's MultiWorkerMirroredStrategy; None in a `tfdtape.horovod`
    job (its callbacks may differ between processes: nothing is handed
    over at the start of training there)."""


def role_of(model):
    """This process's Role in the job of several processes training
    `model`: its MultiWorkerMirroredStrategy's (the chief writes), or the
    `tfdtape.horovod` job's (rank 0 writes); None for a process alone."""
    strategy = job_strategy(model)
    if strategy is not None:
        return Role(worker_broadcast.is_chief(strategy), strategy)
    job = process_job.current()
    if job is not None and job.size > 1:
        return Role(job.rank == 0, None)
    return None


@contextlib.contextmanager
def _placed():
    """While it lasts, this thread's writes are where a callback put them:
    the saving functions write as Keras does."""
    before = getattr(_placement, "active", False)
    _placement.active = True
    try:
        yield
    finally:
        _placement.active = before


def _prefix(kind):
    """The name prefix of this process's `kind` of temporary directory:
    the host and the process id say whose it is (`_remove_stale`)."""
    return f"{kind}-{socket.gethostname()}-{os.getpid()}-"


def _remove_stale(parent, kind):
    """Removes the `kind` directories in `parent` that processes of this
    host no longer running left (killed while writing)."""
    start = f"{kind}-{socket.gethostname()}-"
    for name in os.listdir(parent):
        owner = name[len(start):].split("-", 1)[0]
        if not name.startswith(start) or not owner.isdigit():
            continue
        try:
            os.kill(int(owner), 0)
        except ProcessLookupError:
            path = os.path.join(parent, name)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.remove(path)
        except PermissionError:
            pass  # another user's process, alive


@contextlib.contextmanager
def _private_directory(purpose):
    """A temporary directory of this process, removed with what is in it
    (and those of processes killed before they removed theirs)."""
    kind = f"tfdtape-{purpose}"
    _remove_stale(tempfile.gettempdir(), kind)
    directory = tempfile.mkdtemp(prefix=_prefix(kind))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _is_remote(path):
    return "://" in str(path)


def _synced(path):
    """Flushes a local file or directory to its disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _synced_tree(path):
    """Flushes a local file, or a directory and everything in it."""
    if not os.path.isdir(path):
        _synced(path)
        return
    for root, _, files in os.walk(path):
        for name in files:
            _synced(os.path.join(root, name))
        _synced(root)


def _check_replaceable(written, parent):
    """Raises what renaming each entry of directory `written` over its
    namesake in `parent` raises where one is a directory and the other a
    file."""
    for entry in sorted(os.listdir(written)):
        source, destination = os.path.join(written, entry), os.path.join(parent, entry)
        if os.path.lexists(destination) and os.path.isdir(source) != os.path.isdir(destination):
            code = errno.EISDIR if os.path.isdir(destination) else errno.ENOTDIR
            kind = IsADirectoryError if code == errno.EISDIR else NotADirectoryError
            raise kind(code, os.strerror(code), destination)


def _put(source, destination, spare):
    """Renames `source` to `destination`, a directory over a directory too
    (the one it replaces goes to `spare`, for the caller to remove)."""
    if os.path.isdir(source) and os.path.isdir(destination):
        os.rename(destination, spare)
    os.replace(source, destination)


def _written(model, filepath, overwrite, write):
    """What `write(path)` returns, written where a worker of `model`'s job
    should write `filepath` (see the module's docstring). Where Keras
    itself would stop (a missing directory, an overwrite to confirm) every
    worker calls Keras with `filepath`, so every worker stops alike."""
    role = role_of(model)
    if (role is None or getattr(_placement, "active", False)
            or not isinstance(filepath, (str, os.PathLike))):
        return write(filepath)
    name = os.path.basename(os.path.normpath(os.fspath(filepath)))
    target = os.path.abspath(os.fspath(filepath))
    parent = os.path.dirname(target)
    remote = _is_remote(filepath)
    if not remote and (not os.path.isdir(parent) or (not overwrite and os.path.exists(target))):
        return write(filepath)
    if not role.chief:
        if role.strategy is None:
            warnings.warn(
                f"tfdtape: {name!r} is not written on this process: in a "
                "tfdtape.horovod job of several processes rank 0 writes what Keras "
                "saves and the others' writes are discarded (save on rank 0, as Horovod "
                "programs do, or to a path of this rank's own after hvd.shutdown())",
                stacklevel=3)
        with _private_directory("discarded") as private:
            result = write(os.path.join(private, name))
            if not remote:
                _check_replaceable(private, parent)
            return result
    if remote:
        return write(filepath)
    _remove_stale(parent, ".tfdtape-staging")
    staging = tempfile.mkdtemp(prefix=_prefix(".tfdtape-staging"), dir=parent)
    try:
        result = write(os.path.join(staging, name))
        _check_replaceable(staging, parent)
        for entry in sorted(os.listdir(staging)):
            _synced_tree(os.path.join(staging, entry))
            _put(os.path.join(staging, entry), os.path.join(parent, entry),
                 os.path.join(staging, f".replaced-{entry}"))
        _synced(parent)
        return result
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def make_save_model(original):
    """Returns a `save_model` that, on several workers, writes the chief's
    file whole and nothing of the others'."""

    @functools.wraps(original)
    def save_model(model, filepath, overwrite=True, zipped=None, **kwargs):
        """Keras's `save_model`; on several workers only the chief's file
        reaches `filepath`, renamed into place once whole."""
        if zipped is None:  # Keras's default, decided by the path the caller gave
            zipped = not str(filepath).startswith("hf://")
        return _written(model, filepath, overwrite,
                        lambda path: original(model, path, overwrite, zipped, **kwargs))

    return save_model


def make_save_weights(original):
    """Returns a `save_weights` that, on several workers, writes the
    chief's files whole and nothing of the others'."""

    @functools.wraps(original)
    def save_weights(model, filepath, overwrite=True, max_shard_size=None, **kwargs):
        """Keras's `save_weights`; on several workers only the chief's
        files reach `filepath`'s directory, each renamed into place once
        whole."""
        return _written(model, filepath, overwrite,
                        lambda path: original(model, path, overwrite, max_shard_size, **kwargs))

    return save_weights


def make_export(original):
    """Returns a `Model.export` that, on several workers, writes the
    chief's artifact whole and nothing of the others'."""

    @functools.wraps(original)
    def export(self, filepath, format="tf_saved_model", verbose=None,
               input_signature=None, **kwargs):
        """Keras's `Model.export`; on several workers only the chief's
        artifact reaches `filepath`, renamed into place once whole."""
        return _written(self, filepath, True, lambda path: original(
            self, path, format, verbose, input_signature, **kwargs))

    return export


@contextlib.contextmanager
def _backup_in(callback, directory):
    """While it lasts, `callback` (a BackupAndRestore) keeps its backup in
    `directory`, under the same file names."""
    saved = {name: getattr(callback, name) for name in ("backup_dir", *_BACKUP_FILES)}
    callback.backup_dir = directory
    for name in _BACKUP_FILES:
        setattr(callback, name, os.path.join(directory, os.path.basename(saved[name])))
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(callback, name, value)


def finish_commit(backup_dir, weights_name, metadata_name):
    """Completes or discards the commit a killed chief left in
    `backup_dir`'s staging directory: with the weights still staged it had
    not begun (the last commit stands); with only the metadata staged the
    weights were in place, so the metadata follows them."""
    staging = os.path.join(backup_dir, STAGING)
    if not os.path.isdir(staging):
        return
    staged = set(os.listdir(staging))
    if weights_name not in staged and metadata_name in staged:
        os.replace(os.path.join(staging, metadata_name), os.path.join(backup_dir, metadata_name))
        _synced(backup_dir)
    shutil.rmtree(staging)


def _chief_backup(callback):
    """The chief's backup files' bytes (None where missing), after
    finishing a commit a killed chief left; and the error reading it
    raised (None if it did not)."""
    try:
        if not _is_remote(callback.backup_dir):
            finish_commit(callback.backup_dir, os.path.basename(callback._weights_path),
                          os.path.basename(callback._training_metadata_path))
        contents = []
        for name in _BACKUP_FILES:
            path = getattr(callback, name)
            contents.append(_read(path) if _exists(path) else None)
        return contents, None
    except OSError as error:
        return [None] * len(_BACKUP_FILES), f"{type(error).__name__}: {error}"


def _exists(path):
    return file_io.file_exists_v2(path)


def _read(path):
    return file_io.read_file_to_string(path, binary_mode=True)


def _unreadable(callback, reason):
    return events.refused(OSError(errors.message(
        "BackupAndRestore could not read its backup",
        f"the chief's {callback.backup_dir}", "a backup the chief can read", reason,
        "fix the backup directory on the chief, or remove it to start over")))


def make_backup_on_train_begin(original):
    """Returns a `BackupAndRestore.on_train_begin` that, on several
    workers, restores every worker from the chief's backup."""

    @functools.wraps(original)
    def on_train_begin(self, logs=None):
        """Keras's restore at the start of `fit`; on several workers from
        the chief's backup files, which every worker receives through the
        job's collectives and restores from a private copy. In a restarted
        attempt of `tfdtape launch` whose `fit` had ended, from the copy
        kept then (`keras3_finished_training`)."""
        role = role_of(self.model)
        if role is None or role.strategy is None:
            if role is None:
                keras3_finished_training.restore(self)
            return original(self, logs)
        if role.chief:
            keras3_finished_training.restore(self)
        contents, failure = (_chief_backup(self) if role.chief
                             else ([None] * len(_BACKUP_FILES), None))
        received = worker_broadcast.from_chief(
            role.strategy, [None if failure is None else failure.encode(), *contents])
        if received[0] is not None:
            raise _unreadable(self, received[0].decode())
        with _private_directory("restore") as private, _backup_in(self, private):
            for name, content in zip(_BACKUP_FILES, received[1:]):
                if content is not None:
                    with open(getattr(self, name), "wb") as file:
                        file.write(content)
            return original(self, logs)

    return on_train_begin


def make_backup_save_model(original):
    """Returns a `BackupAndRestore._save_model` that, on several workers,
    commits the chief's backup whole and writes nothing of the others'."""

    @functools.wraps(original)
    def _save_model(self):
        """Keras's backup; on several workers the chief's weights and
        metadata are staged, then renamed into place (weights first); the
        others' go to a private directory, removed."""
        role = role_of(self.model)
        if role is None:
            return original(self)
        if not role.chief:
            with _private_directory("discarded") as private, _backup_in(self, private), \
                    _placed():
                return original(self)
        if _is_remote(self.backup_dir):
            with _placed():
                return original(self)
        weights, metadata = self._weights_path, self._training_metadata_path
        os.makedirs(self.backup_dir, exist_ok=True)
        finish_commit(self.backup_dir, os.path.basename(weights), os.path.basename(metadata))
        if self.double_checkpoint:
            for current, previous in ((weights, self._prev_weights_path),
                                      (metadata, self._prev_training_metadata_path)):
                if os.path.exists(current):
                    _copied_whole(current, previous)
        staging = os.path.join(self.backup_dir, STAGING)
        os.makedirs(staging)
        double, self.double_checkpoint = self.double_checkpoint, False
        try:
            with _backup_in(self, staging), _placed():
                result = original(self)
        finally:
            self.double_checkpoint = double
        _synced_tree(staging)
        os.replace(os.path.join(staging, os.path.basename(weights)), weights)
        os.replace(os.path.join(staging, os.path.basename(metadata)), metadata)
        _synced(self.backup_dir)
        os.rmdir(staging)
        return result

    return _save_model


def _copied_whole(source, destination):
    """Copies a file by way of a temporary file beside `destination` (made
    with the source's mode, where mkstemp would make it private)."""
    parent = os.path.dirname(destination)
    _remove_stale(parent, ".tfdtape-copy")
    temporary = os.path.join(parent, _prefix(".tfdtape-copy") + os.path.basename(destination))
    try:
        shutil.copyfile(source, temporary)
        shutil.copymode(source, temporary)
        _synced(temporary)
        os.replace(temporary, destination)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def make_backup_on_train_end(original):
    """Returns a `BackupAndRestore.on_train_end` that, on several workers,
    deletes the backup on the chief only."""

    @functools.wraps(original)
    def on_train_end(self, logs=None):
        """Keras's deletion of the backup at the end of `fit`; on several
        workers the chief's only, under `tfdtape launch` after a copy is
        kept for a restarted attempt (`keras3_finished_training`). The
        epoch Keras resumed this `fit` at is cleared from the model (Keras
        keeps it, and the next `fit` would start at it)."""
        if getattr(self.model, "_initial_epoch", None) is not None:
            # The epoch this callback resumed at is this fit's: Keras keeps
            # it on the model, and a later fit would start there too.
            self.model._initial_epoch = None
        role = role_of(self.model)
        if role is not None and not role.chief:
            return None
        if self.delete_checkpoint and (role is None or role.strategy is not None):
            keras3_finished_training.remember(self)
        return original(self, logs)

    return on_train_end


def _mirrored_in(directory, path):
    """`path` (a file name pattern, local or remote) under `directory`."""
    text = str(path).split("://", 1)[-1]
    return os.path.join(directory, os.path.abspath(text).lstrip(os.sep))


def make_checkpoint_save_model(original):
    """Returns a `ModelCheckpoint._save_model` that, on several workers,
    writes the chief's checkpoint and nothing of the others'."""

    @functools.wraps(original)
    def _save_model(self, epoch, batch, logs):
        """Keras's checkpoint; on several workers the others' files go to
        a private directory, removed (the chief's are written whole by the
        saving functions)."""
        role = role_of(self.model)
        if role is None or role.chief:
            return original(self, epoch, batch, logs)
        pattern = self.filepath
        with _private_directory("discarded") as private, _placed():
            self.filepath = _mirrored_in(private, pattern)
            try:
                return original(self, epoch, batch, logs)
            finally:
                self.filepath = pattern

    return _save_model
