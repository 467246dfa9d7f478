"""Horovod's `DistributedOptimizer` for Keras 3 and tf_keras optimizers
(a LossScaleOptimizer too): the optimizer's own class, subclassed, whose
apply all-reduces the gradients across the processes first."""

import sys
import threading

import tensorflow as tf

from tfdtape import errors
from tfdtape.horovod import collectives
from tfdtape.horovod import compression as compression_lib
from tfdtape.horovod import ops
from tfdtape.horovod import process_sets
from tfdtape.horovod import tape as tape_lib
from tfdtape.horovod import wrapping


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                         compression=compression_lib.Compression.none,
                         sparse_as_dense=False, gradient_predivide_factor=1.0,
                         op=ops.Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=None, scale_local_gradients=True, local_layers=()):
    """`optimizer` (a Keras 3 or tf_keras optimizer, a LossScaleOptimizer
    too) that all-reduces the gradients across the processes by `op`
    (Horovod's default: the average) before applying them: in `model.fit`
    and in a custom loop alike (Keras 3: `apply` and `apply_gradients`;
    tf_keras: `apply_gradients` and `minimize`).

    Under a LossScaleOptimizer (mixed_float16: `compile` wraps the
    optimizer in one) the gradients are all-reduced before the loss scale
    checks them, so every process takes or skips the step alike.

    With `backward_passes_per_step` N > 1, as Horovod: each call adds this
    process's gradients to local accumulators, and every Nth all-reduces
    the accumulated sum (divided by N with `average_aggregated_gradients`),
    applies it and resets the accumulators by assignment; `iterations`
    counts every call.

    The weights of `local_layers` (`PartialDistributedOptimizer`'s), and
    variables given to its `register_local_var`, keep this process's
    gradient (divided by the size with `scale_local_gradients`), as
    Horovod's.

    Raises:
        ValueError: `gradient_predivide_factor` with an op other than
            Average; `backward_passes_per_step` not a whole number >= 1; an
            optimizer that is not a Keras optimizer.
    """
    symbol = "tfdtape.horovod.keras.DistributedOptimizer"
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(errors.message(
            "backward_passes_per_step is not a count of passes", symbol,
            "a whole number, 1 or more", repr(backward_passes_per_step),
            "pass 1 (every call applies) or the number of calls to accumulate"))
    op = ops.resolve_op(op, None, symbol)
    ops.check_predivide(op, gradient_predivide_factor, symbol)
    if not hasattr(optimizer, "apply_gradients"):
        raise ValueError(errors.message(
            "DistributedOptimizer was given something other than an optimizer", symbol,
            "a Keras optimizer", type(optimizer).__name__,
            "pass a keras.optimizers optimizer (or a tf_keras one)"))
    op, prescale, postscale = ops.predivided(op, gradient_predivide_factor, process_set)
    settings = {"process_set": process_set,
        "op": op, "prescale": prescale, "postscale": postscale,
        "predivide": gradient_predivide_factor,
        "compression": compression, "sparse_as_dense": sparse_as_dense,
        "passes": backward_passes_per_step, "average_passes": average_aggregated_gradients,
        "scale_local": scale_local_gradients,
        "local": {id(weight) for layer in local_layers for weight in layer.trainable_weights}}
    return _distributed(optimizer, settings)


def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                                compression=compression_lib.Compression.none,
                                sparse_as_dense=False, gradient_predivide_factor=1.0,
                                op=ops.Average, backward_passes_per_step=1,
                                average_aggregated_gradients=False, groups=None,
                                process_set=None, local_layers=None,
                                scale_local_gradients=True):
    """Horovod's `horovod.keras.PartialDistributedOptimizer`: a
    `DistributedOptimizer` whose `local_layers` (a Keras layer or a list of
    them) keep this process's gradients.

    Raises:
        ValueError: an op other than Average and Sum, or local layers that
            are not Keras layers (as Horovod's); else as DistributedOptimizer.
    """
    symbol = "tfdtape.horovod.keras.PartialDistributedOptimizer"
    if ops.resolve_op(op, None, symbol) not in (ops.Average, ops.Sum):
        raise ValueError(errors.message(
            "a PartialDistributedOptimizer reducing by another op than Average or Sum",
            symbol, "op=hvd.Average or hvd.Sum", repr(op), "pass one of them"))
    layers = [] if local_layers is None else (
        [local_layers] if not isinstance(local_layers, (list, tuple)) else list(local_layers))
    if not all(hasattr(layer, "trainable_weights") for layer in layers):
        raise ValueError(errors.message(
            "local_layers that are not Keras layers", symbol, "Keras layers",
            ", ".join(type(layer).__name__ for layer in layers),
            "pass the model's layers whose gradients stay local"))
    return DistributedOptimizer(
        optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, groups=groups,
        process_set=process_set, scale_local_gradients=scale_local_gradients,
        local_layers=layers)


def _is_keras3(optimizer):
    """True for a Keras 3 optimizer (its `apply_gradients` calls `apply`)."""
    return hasattr(optimizer, "stateless_apply")


def _is_keras3_loss_scale(optimizer):
    return _is_keras3(optimizer) and hasattr(optimizer, "inner_optimizer") and hasattr(
        optimizer, "scale_loss") and hasattr(optimizer, "check_finite")


def _distributed(optimizer, settings):
    """A copy of `optimizer` whose methods all-reduce as `settings` says."""
    if _is_keras3(optimizer):
        methods = {"apply": _apply, "register_local_var": _register_local_var}
        if not _is_keras3_loss_scale(optimizer):
            methods["loss_scale_factor"] = property(_loss_scale_factor,
                                                    _set_loss_scale_factor)
    else:
        aggregation = ("aggregate_gradients" if hasattr(optimizer, "aggregate_gradients")
                       else "_aggregate_gradients")
        methods = {"apply_gradients": _apply_gradients, aggregation: _aggregate(aggregation),
                   "register_local_var": _register_local_var,
                   "_compute_gradients": _compute_gradients,
                   "_agg_helper": property(_aggregation_helper)}
    wrapped = wrapping.rewrapped(optimizer, methods)
    _settle(wrapped, settings)
    return wrapped


def _settle(optimizer, settings):
    """Gives `optimizer` its all-reduce `settings` and its state, kept out
    of Keras's and TensorFlow's tracking (not saved with the optimizer)."""
    object.__setattr__(optimizer, "_tfdtape_horovod", dict(
        {key: settings[key] for key in _OPTIONS}, local=set(settings["local"]),
        accumulators=None, aggregated=None, applying=False))


_OPTIONS = ("op", "prescale", "postscale", "predivide", "compression", "sparse_as_dense",
            "passes", "average_passes", "scale_local", "process_set")
"""The settings that say how a DistributedOptimizer all-reduces."""


def _register_local_var(self, var):
    """Horovod's: `var`'s gradient stays this process's own (not
    all-reduced; divided by the size with scale_local_gradients)."""
    self._tfdtape_horovod["local"].add(id(var))


def _loss_scale_factor(self):
    """The factor, as Keras keeps it. Keras 3's LossScaleOptimizer reads
    (and sets) its inner optimizer's factor as it wraps it, as `compile`
    does under mixed_float16: that LossScaleOptimizer then becomes the one
    that all-reduces, before its finiteness check, and this one applies
    what it is given."""
    _adopt_wrapping_loss_scale_optimizer(self)
    return self.__dict__.get("loss_scale_factor")


def _set_loss_scale_factor(self, value):
    _adopt_wrapping_loss_scale_optimizer(self)
    self.__dict__["loss_scale_factor"] = value


def _adopt_wrapping_loss_scale_optimizer(optimizer):
    settings = optimizer.__dict__.get("_tfdtape_horovod")
    if settings is None:
        return
    outer = _wrapping_loss_scale_optimizer(optimizer)
    if outer is None or "_tfdtape_horovod" in vars(outer):
        return
    wrapping.convert(outer, {"apply": _apply})
    _settle(outer, settings)


def _wrapping_loss_scale_optimizer(optimizer):
    """The Keras 3 LossScaleOptimizer whose constructor is setting an
    attribute of `optimizer`, its inner optimizer; None otherwise."""
    frame = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return None
        caller = frame.f_locals.get("self")
        if (caller is not optimizer and _is_keras3_loss_scale(caller)
                and getattr(caller, "inner_optimizer", None) is optimizer):
            return caller
        frame = frame.f_back
    return None


_applying = threading.local()
"""`depth`: how many Keras 3 DistributedOptimizers (a LossScaleOptimizer
around one, say) are applying gradients they all-reduced, in this thread."""


def _apply(self, grads, trainable_variables=None):
    """Keras 3: all-reduces the gradients (accumulating passes first), then
    applies them as the optimizer does; applies as given when called by a
    DistributedOptimizer around this one (a LossScaleOptimizer that
    all-reduced them)."""
    base = type(self).__mro__[1]
    if getattr(_applying, "depth", 0):
        return base.apply(self, grads, trainable_variables)
    variables = list(trainable_variables if trainable_variables is not None
                     else self._trainable_variables)

    def apply_reduced(pairs):
        _applying.depth = getattr(_applying, "depth", 0) + 1
        try:
            return base.apply(self, [gradient for gradient, _ in pairs],
                              trainable_variables)
        finally:
            _applying.depth -= 1

    return _reduce_or_accumulate(self, list(zip(grads, variables)), apply_reduced)


def _apply_gradients(self, grads_and_vars, *args, **kwargs):
    """tf_keras: all-reduces the gradients (accumulating passes first), then
    applies them as the optimizer does; where this optimizer's own
    aggregation all-reduced them (a LossScaleOptimizer calls it before its
    finiteness check), applies them as given."""
    base = type(self).__mro__[1]
    settings = self._tfdtape_horovod
    pairs = list(grads_and_vars)

    def apply_reduced(reduced):
        settings["applying"] = True
        try:
            return base.apply_gradients(self, reduced, *args, **kwargs)
        finally:
            settings["applying"] = False

    aggregated, settings["aggregated"] = settings["aggregated"], None
    if aggregated is not None and len(aggregated) == len(pairs) and all(
            gradient is done for (gradient, _), done in zip(pairs, aggregated)):
        return apply_reduced(pairs)
    return _reduce_or_accumulate(self, pairs, apply_reduced)


def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
    """Horovod's (tf_keras): the gradients of `loss` (a tensor `tape`
    recorded, or a callable recorded here) for `var_list`, all-reduced as
    the optimizer's settings say; `apply_gradients` of them applies them as
    given. With backward_passes_per_step N > 1 this pass's own gradients:
    `apply_gradients` accumulates them and all-reduces and applies the sum
    of every N."""
    tape = tf.GradientTape() if tape is None else tape
    if callable(loss):
        with tape:
            if not callable(var_list):
                tape.watch(var_list)
            loss = loss()
    variables = list(var_list() if callable(var_list) else var_list)
    gradients = tape.gradient(loss, variables, output_gradients=grad_loss)
    pairs = list(zip(gradients, variables))
    settings = self._tfdtape_horovod
    if settings["passes"] > 1:
        return pairs
    reduced = _reduced_pairs(self, pairs)
    settings["aggregated"] = [gradient for gradient, _ in reduced]
    return reduced


class _PassCounter:
    """Horovod's `_agg_helper` as its tests read it: `counter`, the passes
    accumulated since the last apply."""

    def __init__(self, settings):
        self._settings = settings

    @property
    def counter(self):
        done = self._settings.get("passes_done")
        if done is None:
            return tf.constant(0, tf.int64)
        return tf.math.floormod(done.read_value(), self._settings["passes"])


def _aggregation_helper(self):
    """None with one backward pass per step, as Horovod's; else the count
    of passes accumulated (`counter`)."""
    settings = self._tfdtape_horovod
    return None if settings["passes"] == 1 else _PassCounter(settings)


def _aggregate(name):
    """tf_keras's aggregation hook `name`, which a LossScaleOptimizer calls
    on its inner optimizer before checking the gradients: all-reduces them
    there (outside `apply_gradients`), so every process checks the same."""

    def aggregate(self, grads_and_vars):
        base = getattr(type(self).__mro__[1], name)
        settings = self._tfdtape_horovod
        if settings["applying"]:
            return base(self, grads_and_vars)
        if settings["passes"] > 1:
            raise ValueError(errors.message(
                "a LossScaleOptimizer checks gradients this DistributedOptimizer "
                "accumulates", "tfdtape.horovod.keras.DistributedOptimizer",
                "backward_passes_per_step=1 under a tf_keras LossScaleOptimizer",
                f"backward_passes_per_step={settings['passes']}",
                "wrap the LossScaleOptimizer instead: DistributedOptimizer("
                "LossScaleOptimizer(optimizer), backward_passes_per_step=N), and compile "
                "with that"))
        pairs = list(grads_and_vars)
        reduced = _reduced_pairs(self, pairs)
        result = list(base(self, reduced))
        settings["aggregated"] = [gradient for gradient, _ in result]
        return result

    aggregate.__name__ = name
    return aggregate


def _reduce_or_accumulate(self, pairs, apply_reduced):
    if self._tfdtape_horovod["passes"] == 1:
        return apply_reduced(_reduced_pairs(self, pairs))
    return _accumulate(self, pairs, apply_reduced)


def _accumulate(self, pairs, apply_reduced):
    """Adds this pass's gradients to the accumulators; on every Nth pass
    all-reduces and applies their sum (by `apply_reduced`) and resets them."""
    settings = self._tfdtape_horovod
    variables = [variable for _, variable in pairs]
    if settings["accumulators"] is None:
        with tf.init_scope():
            if hasattr(self, "build") and not getattr(self, "built", True):
                self.build(variables)
            settings["accumulators"] = [
                tf.Variable(tf.zeros(variable.shape, variable.dtype), trainable=False)
                for variable in variables]
            settings["passes_done"] = tf.Variable(0, dtype=tf.int64, trainable=False)
    accumulators, passes = settings["accumulators"], settings["passes"]
    updates = [accumulator.assign_add(tf.convert_to_tensor(gradient))
               for (gradient, _), accumulator in zip(pairs, accumulators)
               if gradient is not None]
    with tf.control_dependencies(updates):
        done = settings["passes_done"].assign_add(1)

    def apply():
        summed = [(tf.identity(accumulator) if gradient is not None else None, variable)
                  for (gradient, variable), accumulator in zip(pairs, accumulators)]
        reduced = _reduced_pairs(self, summed)
        if settings["average_passes"]:  # as Horovod: the all-reduced sum divided by N
            reduced = [(None if gradient is None else gradient / passes, variable)
                       for gradient, variable in reduced]
        applied = apply_reduced(reduced)
        with tf.control_dependencies([applied] if isinstance(applied, tf.Operation)
                                     else []):
            resets = [accumulator.assign(tf.zeros_like(accumulator))
                      for accumulator in accumulators]
        with tf.control_dependencies(resets):
            return tf.constant(True)

    def skip():
        with tf.control_dependencies([self.iterations.assign_add(1)]):
            return tf.constant(False)

    if tf.executing_eagerly():
        return apply() if int(done) % passes == 0 else skip()
    return tf.cond(tf.equal(done % passes, 0), apply, skip)


def _reduced_pairs(self, pairs):
    """`pairs` with their gradients all-reduced as the optimizer's settings
    say (None stays None, and is part of the check), among its process set."""
    settings = self._tfdtape_horovod
    symbol = "tfdtape.horovod.DistributedOptimizer"
    if not process_sets.includes(settings["process_set"], symbol):
        return list(pairs)  # Horovod's: a set without this process leaves them local
    with collectives.within(settings["process_set"], symbol):
        return _reduced_in_set(settings, pairs)


def _reduced_in_set(settings, pairs):
    gradients = [gradient for gradient, _ in pairs]
    local = [id(variable) in settings["local"] for _, variable in pairs]
    if settings["sparse_as_dense"]:
        gradients = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                     for g in gradients]
    for index, gradient in enumerate(gradients):
        if local[index] and gradient is not None and settings["scale_local"]:
            gradients[index] = tape_lib.divided(gradient, collectives.size())
    present = [index for index, gradient in enumerate(gradients)
               if gradient is not None and not local[index]]
    ops.check_predivided_slices([gradients[index] for index in present], settings["predivide"],
                                "tfdtape.horovod.DistributedOptimizer")
    absent = tuple(index for index, gradient in enumerate(gradients)
                   if gradient is None and not local[index])
    with tf.name_scope("DistributedOptimizer_Allreduce"):
        reduced = ops.reduce_group(
            [gradients[index] for index in present], settings["op"],
            settings["prescale"], settings["postscale"], settings["compression"],
            kind="gradient all-reduce", symbol="tfdtape.horovod.DistributedOptimizer",
            absent=absent)
    for index, value in zip(present, reduced):
        gradients[index] = value
    return list(zip(gradients, [variable for _, variable in pairs]))
