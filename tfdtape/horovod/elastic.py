"""Horovod's elastic API (`hvd.elastic`) for a job of fixed size that
restarts: `tfdtape launch --max-restarts N`.

Horovod keeps commits in memory and lets the living processes go on with
new peers. TensorFlow's collective runtime fixes the job's members when a
process starts, so here a lost process means every process starts again
(the launcher's `--max-restarts`), and a commit must outlive the
processes: `commit()` also writes the state into the launch's directory
(TFDTAPE_LAUNCH_DIR, which every attempt shares), rank 0 alone, through a
temporary file renamed into place (whole or not at all). `run(func)` reads
the last commit on rank 0, hands it to every process (`broadcast_object`),
puts it in place, calls the reset callbacks on a restarted attempt,
`sync()`s and calls `func(state)`. A failed collective ends the process,
and the launcher restarts the job.

A changing number of processes (`--min-np`, `--max-np`, host discovery) is
refused by the launcher; `check_host_updates()` therefore never finds
hosts updated.
"""

import functools
import itertools
import os
import pickle

import numpy as np

from tfdtape import errors
from tfdtape.horovod import basics
from tfdtape.horovod import ops
from tfdtape.launchers import tf_config

DIRECTORY_VARIABLE = tf_config.LAUNCH_DIRECTORY
"""The directory every attempt of a launch shares, where commits live."""
RESTART_VARIABLE = tf_config.RESTART_COUNT
_numbering = itertools.count()


def _commit_directory():
    """The launch's directory; refused when the job has none."""
    directory = os.environ.get(DIRECTORY_VARIABLE)
    if not directory:
        raise RuntimeError(errors.message(
            "Horovod's elastic state has nowhere to keep its commits",
            "tfdtape.horovod.elastic", f"{DIRECTORY_VARIABLE}, a directory the job's "
            "attempts share", "no such variable",
            "Start the job with `python -m tfdtape launch --max-restarts N`, or set "
            f"{DIRECTORY_VARIABLE} to a directory every process and restart can reach"))
    os.makedirs(directory, exist_ok=True)  # one the program named itself may not exist yet
    return directory


class State:
    """What a job keeps across restarts (Horovod's `State`): `save()` a
    copy in memory, `restore()` it, `sync()` rank 0's to every process,
    `commit()` = save, write for the next attempt, check host updates."""

    def __init__(self, bcast_object=None, get_rank=None):
        self._bcast_object = bcast_object or ops.broadcast_object
        self._rank = get_rank or basics.rank
        self._reset_callbacks = []
        self._file_name = f"horovod-elastic-state-{next(_numbering)}.pickle"

    def register_reset_callbacks(self, callbacks):
        """Adds functions called when the job resets: here, when a
        restarted attempt resumes from the last commit."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Saves the state, writes it where a restarted job finds it (rank
        0, whole or not at all), and checks for host updates."""
        self.save()
        if self._rank() == 0:
            self._write(self._committed())
        self.check_host_updates()

    def check_host_updates(self):
        """The job's hosts never change (a fixed number of processes)."""

    def save(self):
        raise NotImplementedError

    def restore(self):
        raise NotImplementedError

    def sync(self):
        raise NotImplementedError

    def _committed(self):
        """What `commit()` writes: a picklable copy of the saved state."""
        raise NotImplementedError

    def _resume(self, committed):
        """Puts a commit (`_committed()`'s value) in place as the saved
        state and the live one."""
        raise NotImplementedError

    def _path(self):
        return os.path.join(_commit_directory(), self._file_name)

    def _write(self, committed):
        path = self._path()
        temporary = f"{path}.{os.getpid()}.tmp"  # made as open() makes files (umask)
        try:
            with open(temporary, "wb") as file:
                pickle.dump(committed, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
        finally:
            if os.path.exists(temporary):
                os.remove(temporary)

    def _read(self):
        """The last commit (rank 0's file), or None."""
        path = self._path()
        if self._rank() != 0 or not os.path.exists(path):
            return None
        with open(path, "rb") as file:
            return pickle.load(file)


class ObjectState(State):
    """Python objects as attributes (Horovod's `ObjectState`): each keyword
    argument becomes an attribute, saved, restored and synced."""

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {name: getattr(self, name) for name in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for name, value in self._saved_state.items():
            setattr(self, name, value)

    def _committed(self):
        return {"objects": dict(self._saved_state)}

    def _resume(self, committed):
        self._saved_state = dict(committed["objects"])
        self._set_attrs()


def _values(variables):
    return [np.array(variable.numpy()) for variable in variables]


def _assign(variables, values, what, strict=True):
    """Assigns `values` to `variables` in order. A commit must fit exactly;
    an in-memory save (`strict=False`) restores the pairs there are, as
    Horovod's does (a save made before the optimizer's first step holds
    fewer of its variables)."""
    if not strict:
        values = values[:len(variables)]
        variables = variables[:len(values)]
    if len(variables) != len(values):
        raise ValueError(errors.message(
            "the elastic state's commit does not fit", f"tfdtape.horovod.elastic ({what})",
            f"{len(variables)} values", f"{len(values)}",
            "Resume the program that made the commit, or remove the launch directory's "
            "horovod-elastic-state files to start over"))
    for variable, value in zip(variables, values):
        variable.assign(value)


class TensorFlowState(ObjectState):
    """A list of variables (Horovod's `TensorFlowState`), and objects as
    attributes. TensorFlow 1 sessions are not supported."""

    def __init__(self, variables=None, session=None, **kwargs):
        if session is not None or variables is None:
            raise NotImplementedError(errors.message(
                "TensorFlowState of a TensorFlow 1 session or of the global variables",
                "tfdtape.horovod.elastic.TensorFlowState", "the variables, eagerly",
                "a session" if session is not None else "no variables",
                "Pass the variables to keep: TensorFlowState(model.variables)"))
        self.variables = list(variables)
        self._values = _values(self.variables)
        super().__init__(**kwargs)

    def save(self):
        self._values = _values(self.variables)
        super().save()

    def restore(self):
        _assign(self.variables, self._values, "variables", strict=False)
        super().restore()

    def sync(self):
        ops.broadcast_variables(self.variables, root_rank=0)
        self._values = _values(self.variables)
        super().sync()

    def _committed(self):
        return dict(super()._committed(), variables=self._values)

    def _resume(self, committed):
        _assign(self.variables, committed["variables"], "variables")
        self._values = list(committed["variables"])
        super()._resume(committed)


def _optimizer_variables(optimizer):
    found = optimizer.variables
    return list(found() if callable(found) else found)


class TensorFlowKerasState(ObjectState):
    """A Keras model and its optimizer (Horovod's `TensorFlowKerasState`),
    and objects as attributes."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        if not model.built:
            raise ValueError("Model must be built first. Run `model.build(input_shape)`.")
        self.model = model
        self.optimizer = optimizer or model.optimizer
        self.backend = backend
        self._save_model()
        super().__init__(**kwargs)

    def save(self):
        self._save_model()
        super().save()

    def restore(self):
        self._load_model(self._saved_model_state, self._saved_optimizer_state, strict=False)
        super().restore()

    def sync(self):
        ops.broadcast_variables(self.model.variables, root_rank=0)
        ops.broadcast_variables(_optimizer_variables(self.optimizer), root_rank=0)
        self._save_model()
        super().sync()

    def _save_model(self):
        self._saved_model_state = _values(self.model.variables)
        self._saved_optimizer_state = _values(_optimizer_variables(self.optimizer))

    def _load_model(self, model_values, optimizer_values, strict=True):
        _assign(self.model.variables, model_values, "the model's variables", strict)
        if (len(_optimizer_variables(self.optimizer)) < len(optimizer_values)
                and hasattr(self.optimizer, "build")):
            self.optimizer.build(self.model.trainable_variables)  # made at the first step
        _assign(_optimizer_variables(self.optimizer), optimizer_values,
                "the optimizer's variables", strict)

    def _committed(self):
        return dict(super()._committed(), model=self._saved_model_state,
                    optimizer=self._saved_optimizer_state)

    def _resume(self, committed):
        self._load_model(committed["model"], committed["optimizer"])
        self._save_model()
        super()._resume(committed)


def run(func):
    """Horovod's `hvd.elastic.run`: `func(state, ...)` resumed from the last
    commit of an earlier attempt of the launch, on every process."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        _commit_directory()
        committed = ops.broadcast_object(state._read(), root_rank=0)
        if committed is not None:
            state._resume(committed)
        if int(os.environ.get(RESTART_VARIABLE, "0")) > 0:
            state.on_reset()
        state.sync()
        return func(state, *args, **kwargs)

    return wrapper


__all__ = ["ObjectState", "State", "TensorFlowKerasState", "TensorFlowState", "run"]
