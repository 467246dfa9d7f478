"""Horovod's elastic Keras API (`horovod.tensorflow.keras.elastic`):
`KerasState`, and the callbacks that keep `state.epoch` and `state.batch`
and commit the state, over `tfdtape.horovod.elastic` (a job of fixed size
that restarts). Made for the Keras `tf.keras` is."""

import warnings

import tensorflow as tf

from tfdtape.horovod.elastic import ObjectState
from tfdtape.horovod.elastic import State
from tfdtape.horovod.elastic import TensorFlowKerasState
from tfdtape.horovod.elastic import TensorFlowState
from tfdtape.horovod.elastic import run


class KerasState(TensorFlowKerasState):
    """A Keras model and optimizer, and objects as attributes."""

    def __init__(self, model, optimizer=None, **kwargs):
        super().__init__(model, optimizer=optimizer, backend=tf.keras.backend, **kwargs)


class CommitStateCallback(tf.keras.callbacks.Callback):
    """Commits `state` every `batches_per_commit` batches and at the end of
    every epoch."""

    def __init__(self, state, batches_per_commit=1):
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs=None):
        self.batches_remaining = self.batches_per_commit

    def on_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()


class UpdateBatchStateCallback(tf.keras.callbacks.Callback):
    """Keeps `state.batch` at the last batch done, and sets the callbacks'
    `params["steps"]` to the steps an epoch resumed in its middle had left,
    as Horovod does. Keras's `fit` reads neither: such an epoch runs from
    its first batch again, training its first batches twice; it says so
    (a warning). Commit at the ends of epochs to resume exactly."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.steps_per_epoch = None

    def on_train_begin(self, logs=None):
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        if self.state.batch:
            warnings.warn(
                f"tfdtape.horovod.keras.elastic: resuming from a commit after batch "
                f"{self.state.batch} of an epoch, which Keras's fit runs from its first "
                "batch again (those batches are trained twice); commit at the ends of "
                "epochs (CommitStateCallback's batches_per_commit at least the epoch's "
                "steps) to resume exactly", stacklevel=2)
        if self.params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = self.params.get("steps")
            self.params["steps"] = self.steps_per_epoch - self.state.batch

    def on_batch_end(self, batch, logs=None):
        self.state.batch = batch

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(tf.keras.callbacks.Callback):
    """Keeps `state.epoch` at the number of epochs done, across restarts."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.initial_epoch = self.state.epoch

    def on_train_begin(self, logs=None):
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = self.initial_epoch + epoch + 1


__all__ = ["CommitStateCallback", "KerasState", "ObjectState", "State", "TensorFlowKerasState",
           "TensorFlowState", "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run"]
