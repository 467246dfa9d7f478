"""A launch restarted after its training ended does not train again.

Keras 3's BackupAndRestore deletes its backup when `fit` ends, so a job of
`tfdtape launch --max-restarts N` whose process dies after `fit` (at exit,
say) is started again with no backup and trains from epoch 0 a second time.
Under `tfdtape launch` (TFDTAPE_LAUNCH_DIR, which every attempt shares and
the launcher removes at its end), the chief (or the process alone) first
keeps a copy of the last backup there (`remember`), and Keras deletes the
backup as before. In a later attempt (TFDTAPE_RESTART_COUNT > 0), where the
backup directory holds no backup, the copy is put back before Keras's
restore (`restore`): `fit` starts at its last epoch's end, trains no epoch
and leaves the model with the weights the ended `fit` gave it. Each copy
belongs to one `fit` call: the n-th `fit` of the process on that backup
directory (`begin` counts them), so a program that calls `fit` again on the
same directory, or on another model, gets each call's own. Only backups
saved once per epoch (`save_freq="epoch"`, the default) on a local path,
and not in a `tfdtape.horovod` job (whose restore is each process's own).
Keras is never imported here.
"""

import hashlib
import os
import shutil
import warnings

from tfdtape import process_state
from tfdtape.launchers import tf_config

RECORDS = "finished-backups"
"""The launch directory's subdirectory holding the copies, one per backup
directory (named by a digest of its absolute path)."""


_fits = process_state.kept(globals(), "_fits", dict)
"""{backup directory's absolute path: how many `fit`s began on it}."""
ORDINAL = "_tfdtape_fit_ordinal"
"""The callback's attribute: which `fit` on its directory it serves (1st...)."""


def begin(callback):
    """Counts a `fit` beginning with `callback`: it is the n-th on its
    backup directory in this process."""
    path = os.path.abspath(str(callback.backup_dir))
    _fits[path] = _fits.get(path, 0) + 1
    setattr(callback, ORDINAL, _fits[path])


def _record_of(callback):
    """Where the launch keeps the copy of `callback`'s `fit`; None where
    none is kept."""
    launch = os.environ.get(tf_config.LAUNCH_DIRECTORY)
    backup = str(callback.backup_dir)
    ordinal = getattr(callback, ORDINAL, None)
    if not launch or ordinal is None or callback.save_freq != "epoch" or "://" in backup:
        return None
    digest = hashlib.sha256(os.path.abspath(backup).encode()).hexdigest()[:16]
    return os.path.join(launch, RECORDS, f"{digest}-fit-{ordinal}")


def _files(callback):
    return (callback._weights_path, callback._training_metadata_path)


def remember(callback):
    """Copies `callback`'s last backup (weights, then metadata: the copy is
    renamed into place whole) into the launch's directory, before Keras
    deletes it at the end of `fit`."""
    record = _record_of(callback)
    if record is None or not all(os.path.exists(path) for path in _files(callback)):
        return
    staging = f"{record}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    for path in _files(callback):
        shutil.copy2(path, os.path.join(staging, os.path.basename(path)))
    shutil.rmtree(record, ignore_errors=True)
    os.replace(staging, record)


def restore(callback):
    """In a restarted attempt of the launch, where this `fit` (the n-th on
    its directory) ended in an earlier attempt, puts the copy of its last
    backup in the backup directory (over what a later `fit` on the
    directory left there), so that Keras resumes at that `fit`'s end.
    Returns whether it did."""
    begin(callback)
    record = _record_of(callback)
    attempt = int(os.environ.get(tf_config.RESTART_COUNT, "0") or 0)
    if record is None or attempt == 0 or not os.path.isdir(record):
        return False
    os.makedirs(callback.backup_dir, exist_ok=True)
    for path in _files(callback):  # the metadata last: Keras reads it first
        partial = f"{path}.tfdtape-partial"
        shutil.copy2(os.path.join(record, os.path.basename(path)), partial)
        os.replace(partial, path)
    warnings.warn(
        f"tfdtape: fit number {getattr(callback, ORDINAL)} backed up in "
        f"{callback.backup_dir} ended in an earlier attempt of this launch (this is "
        f"attempt {attempt}): it resumes at its end and trains no epoch again",
        RuntimeWarning, stacklevel=2)
    return True
