"""Horovod's Keras callbacks (`horovod.tensorflow.keras.callbacks`):
`BroadcastGlobalVariablesCallback`, `MetricAverageCallback`,
`LearningRateWarmupCallback`, `LearningRateScheduleCallback` and
`BestModelCheckpoint`, made for
the Keras `tf.keras` is (Keras 3, or tf_keras with TF_USE_LEGACY_KERAS=1)."""

import tensorflow as tf

from tfdtape import errors
from tfdtape.horovod import basics
from tfdtape.horovod import ops


def _callback_base():
    return tf.keras.callbacks.Callback


def _learning_rate(optimizer):
    return float(tf.keras.backend.get_value(optimizer.learning_rate))


def _set_learning_rate(optimizer, value):
    learning_rate = optimizer.learning_rate
    if hasattr(learning_rate, "assign"):
        learning_rate.assign(value)
    else:
        optimizer.learning_rate = value


class BroadcastGlobalVariablesCallback(_callback_base()):
    """Broadcasts the model's variables from `root_rank` at the start of
    training (where the model is built by then), and the model's and the
    optimizer's after the first batch, as Horovod does (the optimizer's own
    variables exist then on every process, and a process that loaded a
    checkpoint's optimizer state hands it out), so every process trains
    from `root_rank`'s weights; but for `local_variables`, which each
    process keeps. A `fit` that ran no batch (a restarted job resuming at
    its last epoch) broadcasts both at its end instead, the optimizer built
    first where it has no variables yet, so every process ends holding
    `root_rank`'s state (Horovod's callback leaves the others' own); a
    legacy optimizer (no `build`) and a model not built yet wait for the
    next fit's first batch."""

    def __init__(self, root_rank, device="", local_variables=None):
        super().__init__()
        self.root_rank = root_rank
        self.local_variables = list(local_variables or ())
        self.broadcast_done = False

    def _broadcast(self, with_optimizer):
        variables = list(self.model.variables)
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and with_optimizer:
            variables += list(optimizer.variables() if callable(optimizer.variables)
                              else optimizer.variables)
        kept = {id(variable) for variable in self.local_variables}
        ops.broadcast_variables([variable for variable in variables
                                 if id(variable) not in kept], self.root_rank)

    def on_train_begin(self, logs=None):
        if getattr(self.model, "built", True):
            self._broadcast(with_optimizer=False)

    def on_batch_end(self, batch, logs=None):
        if not self.broadcast_done:
            self._broadcast(with_optimizer=True)
            self.broadcast_done = True

    def on_train_end(self, logs=None):
        if self.broadcast_done or not getattr(self.model, "built", True) or \
                not self.model.trainable_variables:
            return  # nothing built to hand out: the next fit's first batch does
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is None or not hasattr(optimizer, "build"):
            self._broadcast(with_optimizer=False)  # a legacy optimizer: at the next
            return  # fit's first batch, once it has variables on every process
        if not getattr(optimizer, "built", getattr(optimizer, "_built", False)):  # Keras 3, 2
            optimizer.build(self.model.trainable_variables)
        self._broadcast(with_optimizer=True)
        self.broadcast_done = True


class MetricAverageCallback(_callback_base()):
    """Averages the epoch's logs (every number) over the processes at each
    epoch's end, in the same order on every process."""

    def __init__(self, device=""):
        super().__init__()

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        for name in sorted(logs):
            value = logs[name]
            if isinstance(value, (int, float)) or (hasattr(value, "dtype") and
                                                   getattr(value, "shape", None) == ()):
                averaged = ops.allreduce(tf.constant(float(value), tf.float64),
                                         op=ops.Average)
                logs[name] = float(averaged)


class LearningRateScheduleCallback(_callback_base()):
    """Horovod's schedule: from `start_epoch` to `end_epoch` the learning
    rate is `initial_lr` times `multiplier` (a number, or a function of the
    epoch; with `staircase=False` of the fractional epoch, batch by batch,
    which needs `steps_per_epoch` or Keras's own count)."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None,
                 staircase=True, momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        self.initial_lr = initial_lr
        self.multiplier = multiplier if callable(multiplier) else (lambda _: multiplier)
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = 0

    def _in_range(self, epoch):
        return epoch >= self.start_epoch and (self.end_epoch is None or
                                              epoch < self.end_epoch)

    def _steps(self):
        return self.steps_per_epoch or self.params.get("steps")

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch
        if self._in_range(epoch) and self.staircase:
            _set_learning_rate(self.model.optimizer,
                               self.initial_lr * self.multiplier(epoch))

    def on_batch_begin(self, batch, logs=None):
        if self.staircase or not self._in_range(self.current_epoch):
            return
        steps = self._steps()
        if not steps:
            raise ValueError(errors.message(
                "a batch-by-batch schedule does not know the steps per epoch",
                "tfdtape.horovod.keras.LearningRateScheduleCallback",
                "steps_per_epoch, or a dataset whose length Keras knows", "neither",
                "pass steps_per_epoch"))
        epoch = self.current_epoch + batch / steps
        _set_learning_rate(self.model.optimizer, self.initial_lr * self.multiplier(epoch))

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = _learning_rate(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Horovod's warmup (Goyal et al.): over `warmup_epochs` the learning
    rate grows batch by batch from `initial_lr` / size to `initial_lr`,
    which the last batch of the warmup reaches (Horovod counts each batch
    as ended: epoch + (batch + 1) / steps per epoch)."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            size = basics.size()
            ended = epoch + 1.0 / self._steps()
            return 1.0 / size * (ended * (size - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and basics.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{_learning_rate(self.model.optimizer):g}.")


class BestModelCheckpoint(tf.keras.callbacks.ModelCheckpoint):
    """Horovod's: a ModelCheckpoint that saves the whole model when
    `monitor` improves (save_best_only), to `filepath` (Horovod's Spark
    estimator sets it after construction; here it may also be given).

    Raises:
        ValueError: at the start of training, where no filepath was set.
    """

    _UNSET = "tfdtape-best-model-filepath-unset.keras"  # Keras 3 checks the suffix

    def __init__(self, monitor="val_loss", verbose=0, mode="auto", save_freq="epoch",
                 filepath=None):
        super().__init__(filepath=filepath or self._UNSET, monitor=monitor, verbose=verbose,
                         save_best_only=True, save_weights_only=False, mode=mode,
                         save_freq=save_freq)
        if filepath is None:
            self.filepath = None

    def on_train_begin(self, logs=None):
        if self.filepath is None:
            raise ValueError(errors.message(
                "BestModelCheckpoint has no filepath",
                "tfdtape.horovod.keras.callbacks.BestModelCheckpoint",
                "a filepath set before fit", "None",
                "pass filepath= or set callback.filepath before model.fit"))
        super().on_train_begin(logs)
