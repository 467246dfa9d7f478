"""The one table of what tfdtape patches in TensorFlow, and what it relies on.

`install()` and `uninstall()` both walk `patch_targets()`, and `info` reports
from it, so the three cannot drift apart. A patch for the length of a block
(the observers of `python -m tfdtape run`) goes through the same
`PatchTarget`s, with `scoped()`: `uninstall()` restores what such a block
holds too, and `info` lists the command line's scoped tables.

Each target says who holds it now (`PatchTarget.holder()`):
- TFDTAPE: one of tfdtape's replacements. Each is a function made for one
  install that carries the function it replaced (`original_of`), so
  TensorFlow's originals live in TensorFlow's own attributes, where neither a
  reload of a tfdtape module nor a fresh import of tfdtape can drop them.
- SCOPED: a replacement a `scoped()` block put there, carrying its original
  the same way; it does not count as tfdtape installed.
- TENSORFLOW: TensorFlow's own function, judged by the namespace its code runs
  in (`__globals__`), which `functools.wraps` does not copy, not by its
  `__module__` or name, which it does.
- FOREIGN: anything else: another library's patch.
- MISSING: the attribute is absent.
"""

import contextlib
import dataclasses
import inspect
import sys
import types
from collections.abc import Callable

from tensorflow.python import pywrap_tfe
from tensorflow.python.distribute import collective_all_reduce_strategy
from tensorflow.python.distribute import cross_device_utils
from tensorflow.python.distribute import distribute_lib
from tensorflow.python.distribute import merge_call_interim
from tensorflow.python.distribute import mirrored_run
from tensorflow.python.distribute import values as values_lib
from tensorflow.python.distribute import values_util
from tensorflow.python.eager import backprop
from tensorflow.python.eager import forwardprop
from tensorflow.python.eager import tape as tape_module
from tensorflow.python.framework import ops

from tfdtape import backward_placement
from tfdtape import captured_inputs
from tfdtape import collectives
from tfdtape import compat
from tfdtape import cross_replica_reads
from tfdtape import empty_collectives
from tfdtape import errors
from tfdtape import gradient_tape
from tfdtape import keras2_aggregation
from tfdtape import keras2_loss_scaling
from tfdtape import keras3_accumulation
from tfdtape import keras3_distribution
from tfdtape import keras3_loss_scaling
from tfdtape import keras3_multi_worker
from tfdtape import keras3_saving
from tfdtape import merge_calls
from tfdtape import process_state
from tfdtape import spanning_tapes
from tfdtape import tape_functions
from tfdtape.launchers import tensorflow_job

_MISSING = object()

TFDTAPE = "tfdtape"
SCOPED = "tfdtape-scoped"
TENSORFLOW = "tensorflow"
FOREIGN = "foreign"
MISSING = "missing"

_MARK = "__tfdtape_patch__"
"""On a replacement: (the replacement, its original, whether it is scoped)."""

STAND_IN_MODULES = ("tfdtape.testing",)
"""Modules whose functions count as TensorFlow's own for every target.

`tfdtape.testing` switches TensorFlow 2.12's inline resolution off by putting
resolver-free tape functions in place (the pre_seed and tfdtape_alone
configurations); while they are there, they are TensorFlow's functions.
"""


@dataclasses.dataclass(frozen=True)
class PatchTarget:
    """One attribute of a TensorFlow module or class that tfdtape replaces.

    Attributes:
        owner: the module or class holding the attribute.
        attribute: the attribute's name.
        parameters: the parameter names the original must have.
        make_replacement: called with the original, returns tfdtape's version.
        required: False when a TensorFlow may lack the attribute; it is then
            left alone.
        defined_in: the module whose namespace TensorFlow's function runs
            in, where that is not the owner's (an API module re-exporting
            it); None for the owner's.
        registers: called with each function put in place, where TensorFlow
            also hands the attribute's function to its C++ runtime (which
            keeps the function it was given, not the attribute); None for a
            plain attribute.
    """
    owner: object
    attribute: str
    parameters: tuple[str, ...]
    make_replacement: Callable[[Callable], Callable]
    required: bool = True
    defined_in: object = None
    registers: Callable[[Callable], None] | None = None

    @property
    def symbol(self):
        """The attribute's qualified name, e.g. tensorflow.python.eager.tape.watch_variable."""
        if isinstance(self.owner, type):
            return f"{self.owner.__module__}.{self.owner.__qualname__}.{self.attribute}"
        return f"{self.owner.__name__}.{self.attribute}"

    def current(self):
        """The attribute as the owner holds it now (not bound), or None."""
        return vars(self.owner).get(self.attribute)

    def holder(self):
        """Who holds the attribute now: TFDTAPE, TENSORFLOW, FOREIGN or MISSING."""
        value = vars(self.owner).get(self.attribute, _MISSING)
        if value is _MISSING:
            return MISSING
        if original_of(value) is not None:
            return SCOPED if vars(value)[_MARK][2] else TFDTAPE
        if self._is_tensorflows(value):
            return TENSORFLOW
        return FOREIGN

    def _is_tensorflows(self, value):
        """True if `value` is a plain function whose code runs in the module
        that defines the owner (or in a module of STAND_IN_MODULES)."""
        if type(value) is not types.FunctionType:
            return False  # Proxies such as wrapt's pass isinstance checks.
        if self.defined_in is not None:
            home = self.defined_in
        elif isinstance(self.owner, type):
            home = sys.modules.get(self.owner.__module__)
        else:
            home = self.owner
        modules = [home] + [sys.modules.get(name) for name in STAND_IN_MODULES]
        return any(module is not None and value.__globals__ is vars(module)
                   for module in modules)

    def put(self, function):
        """Puts `function` in the attribute (and registers it, for a target
        TensorFlow registers)."""
        setattr(self.owner, self.attribute, function)
        if self.registers is not None:
            self.registers(function)

    def replacement(self, original, scoped=False):
        """tfdtape's replacement for `original`, made for this install (or,
        `scoped`, for one `scoped()` block)."""
        return _marked_copy(self.make_replacement(original), original, scoped)

    def check(self):
        """Returns the original, or None for a missing optional attribute.

        Raises:
            UnsupportedTensorFlowError: a required attribute is missing, or the
                attribute is not a function with the expected parameters.
        """
        original = vars(self.owner).get(self.attribute, _MISSING)
        if original is _MISSING:
            if not self.required:
                return None
            raise errors.UnsupportedTensorFlowError(errors.message(
                "a function tfdtape patches is missing", self.symbol,
                f"a function {self.attribute}{_signature_text(self.parameters)}",
                "no such attribute", _UPGRADE_ADVICE))
        found = _parameters_of(original)
        if found != self.parameters:
            raise errors.UnsupportedTensorFlowError(errors.message(
                "a function tfdtape patches has an unexpected shape",
                self.symbol, _signature_text(self.parameters),
                _signature_text(found) if found is not None else repr(original),
                _UPGRADE_ADVICE))
        return original


def original_of(value):
    """The function a tfdtape replacement replaced, or None for anything else.

    Only the replacement itself qualifies: a `functools.wraps` wrapper copies
    its attributes and a proxy forwards them, but neither is the object the
    mark names.
    """
    if type(value) is not types.FunctionType:
        return None
    mark = vars(value).get(_MARK)
    if mark is None or mark[0] is not value:
        return None
    return mark[1]


def _marked_copy(function, original, scoped):
    """A copy of `function` (same code, globals, closure and attributes: no
    extra call layer) that carries `original` as the function it replaces,
    and whether it is scoped."""
    copy = types.FunctionType(function.__code__, function.__globals__,
                              function.__name__, function.__defaults__,
                              function.__closure__)
    copy.__kwdefaults__ = function.__kwdefaults__
    copy.__qualname__ = function.__qualname__
    copy.__module__ = function.__module__
    copy.__doc__ = function.__doc__
    copy.__annotations__ = dict(function.__annotations__)
    copy.__dict__.update(function.__dict__)
    copy.__dict__[_MARK] = (copy, original, scoped)
    return copy


_open_scoped = process_state.kept(globals(), "_open_scoped", list)
"""The targets `scoped()` blocks hold now, in the order they were put."""


def open_scoped_targets():
    """The targets that open `scoped()` blocks hold now."""
    return list(_open_scoped)


@contextlib.contextmanager
def scoped(table):
    """Inside the block each target of `table` holds its scoped replacement,
    made from what it holds on entry (an optional target that is missing is
    skipped); on exit what it held is put back, where the attribute still
    holds the scoped replacement (`uninstall()` may have put it back first).

    Raises:
        UnsupportedTensorFlowError: on entry, as `PatchTarget.check`; nothing
            is replaced then.
    """
    checked = [(target, target.check()) for target in table]
    made = {}  # id(original) -> its replacement: modules holding one function
    done = []  # (API aliases) hold one replacement
    try:
        for target, original in checked:
            if original is None:
                continue
            replacement = made.get(id(original))
            if replacement is None:
                replacement = made[id(original)] = target.replacement(
                    original, scoped=True)
            target.put(replacement)
            done.append((target, original, replacement))
            _open_scoped.append(target)
        yield
    finally:
        for target, original, replacement in reversed(done):
            if target.current() is replacement:
                target.put(original)
            _open_scoped.remove(target)


def describe(value):
    """What `value` is, for a message: a function's defining module and
    qualified name (from its code, which `functools.wraps` does not copy), or
    an object's type."""
    if type(value) is types.FunctionType:
        code = value.__code__
        name = getattr(code, "co_qualname", code.co_name)  # co_qualname: 3.11+
        return f"{value.__globals__.get('__name__', '?')}.{name}"
    kind = type(value)
    return f"a {kind.__module__}.{kind.__qualname__} object"


_UPGRADE_ADVICE = ("Install a TensorFlow release that tfdtape supports (see "
                   "`python -m tfdtape info`), or upgrade tfdtape")


def _parameters_of(function):
    """The parameter names of `function`, or None if it is not a function."""
    if not inspect.isfunction(function):
        return None
    return tuple(inspect.signature(function).parameters)


def _signature_text(parameters):
    return "(" + ", ".join(parameters) + ")"


def _unchanged(replacement):
    """A `make_replacement` for a replacement that needs no original."""
    return lambda original: replacement


REQUIRED_SYMBOLS = (
    (compat.strategy_context, "get_strategy_and_replica_context"),
    (compat.strategy_context, "get_strategy"),
    (compat.strategy_context, "get_replica_context"),
    (compat.strategy_context, "has_strategy"),
    (values_util, "get_current_replica_id_as_int"),
    (pywrap_tfe, "TFE_Py_TapeWatchVariable"),
    (pywrap_tfe, "TFE_Py_TapeVariableAccessed"),
    (pywrap_tfe, "TFE_Py_VariableWatcherVariableAccessed"),
    (pywrap_tfe, "TFE_Py_RegisterGradientFunction"),
    (pywrap_tfe, "TFE_Py_RegisterVSpace"),
    (pywrap_tfe, "TFE_Py_TapeSetIsEmpty"),
    (backprop, "_default_vspace"),
)
"""TensorFlow internals tfdtape's replacements call, checked before install."""

STRATEGY_STACK = "_distribution_strategy_stack"
"""The per-graph attribute holding the current tf.distribute thread modes."""


def check_required_symbols():
    """Raises UnsupportedTensorFlowError if a symbol of REQUIRED_SYMBOLS is gone,
    or graphs no longer carry the strategy stack tfdtape reads."""
    graph = ops.get_default_graph()
    for module, name in REQUIRED_SYMBOLS + ((graph, STRATEGY_STACK),):
        if not hasattr(module, name):
            raise errors.UnsupportedTensorFlowError(errors.message(
                "a TensorFlow internal tfdtape calls is missing",
                f"{getattr(module, '__name__', type(module).__name__)}.{name}",
                "it to exist",
                "no such attribute", _UPGRADE_ADVICE))


def patch_targets():
    """Every attribute tfdtape replaces in this TensorFlow, in install order."""
    gradient_parameters = ("self", "target", "sources", "output_gradients",
                           "unconnected_gradients")
    table = [
        PatchTarget(tape_module, "watch_variable", ("tape", "variable"),
                    _unchanged(tape_functions.watch_variable)),
        PatchTarget(tape_module, "variable_accessed", ("variable",),
                    _unchanged(tape_functions.variable_accessed)),
        PatchTarget(tape_module, "variables_accessed", ("variables",),
                    _unchanged(tape_functions.variables_accessed),
                    required=False),
        PatchTarget(backprop.GradientTape, "watch", ("self", "tensor"),
                    _unchanged(gradient_tape.watch)),
        PatchTarget(backprop.GradientTape, "gradient", gradient_parameters,
                    gradient_tape.make_gradient),
        PatchTarget(backprop.GradientTape, "watched_variables", ("self",),
                    gradient_tape.make_watched_variables),
        PatchTarget(backprop.GradientTape, "_push_tape", ("self",),
                    gradient_tape.make_push_tape),
        PatchTarget(backprop.GradientTape, "_pop_tape", ("self",),
                    gradient_tape.make_pop_tape),
        PatchTarget(mirrored_run, "_call_for_each_replica",
                    ("distribution", "fn", "args", "kwargs"),
                    spanning_tapes.make_call_for_each_replica),
        PatchTarget(backprop, "_aggregate_grads", ("gradients",),
                    backward_placement.make_aggregate_grads,
                    registers=backward_placement.register_aggregation),
        PatchTarget(backprop, "_gradient_function",
                    ("op_name", "attr_tuple", "num_inputs", "inputs", "outputs",
                     "out_grads", "skip_input_indices", "forward_pass_name_scope"),
                    backward_placement.make_gradient_function,
                    registers=pywrap_tfe.TFE_Py_RegisterGradientFunction),
        PatchTarget(compat.recording_module, "record_operation",
                    ("op_type", "output_tensors", "input_tensors",
                     "backward_function", "forward_function"),
                    backward_placement.make_record_operation),
        PatchTarget(compat.recording_module, "record_operation_backprop_only",
                    ("op_type", "output_tensors", "input_tensors",
                     "backward_function"),
                    backward_placement.make_record_operation),
        PatchTarget(forwardprop.ForwardAccumulator, "_push_accumulator", ("self",),
                    spanning_tapes.make_push_accumulator),
        PatchTarget(forwardprop.ForwardAccumulator, "_pop_accumulator", ("self",),
                    spanning_tapes.make_pop_accumulator),
        PatchTarget(distribute_lib.ReplicaContextBase, "all_reduce",
                    ("self", "reduce_op", "value", "options"),
                    collectives.make_all_reduce),
        PatchTarget(distribute_lib.ReplicaContext, "all_gather",
                    ("self", "value", "axis", "options"),
                    collectives.make_all_gather),
        PatchTarget(distribute_lib.StrategyExtendedV2, "reduce_to",
                    ("self", "reduce_op", "value", "destinations", "options"),
                    collectives.make_reduce_to),
        PatchTarget(distribute_lib.StrategyExtendedV2, "batch_reduce_to",
                    ("self", "reduce_op", "value_destination_pairs", "options"),
                    collectives.make_batch_reduce_to),
        PatchTarget(distribute_lib.StrategyExtendedV2, "_gather_to",
                    ("self", "value", "destinations", "axis", "options"),
                    collectives.make_gather_to),
        PatchTarget(cross_device_utils.CollectiveReplicaLauncher, "all_reduce",
                    empty_collectives.ALL_REDUCE_PARAMETERS,
                    empty_collectives.make_all_reduce),
        PatchTarget(cross_device_utils.CollectiveReplicaLauncher, "_all_gather",
                    empty_collectives.ALL_GATHER_PARAMETERS,
                    empty_collectives.make_all_gather),
        PatchTarget(collective_all_reduce_strategy.CollectiveAllReduceExtended,
                    "_get_variable_creator_initial_value",
                    empty_collectives.INITIAL_VALUE_PARAMETERS,
                    empty_collectives.make_variable_creator_initial_value),
        PatchTarget(values_lib.MirroredVariable, "_get_cross_replica", ("self",),
                    cross_replica_reads.make_get_cross_replica),
        PatchTarget(collective_all_reduce_strategy.CollectiveAllReduceStrategy,
                    "__init__", ("self", "cluster_resolver", "communication_options"),
                    tensorflow_job.make_strategy_init),
    ]
    table += [PatchTarget(cls, captured_inputs.RESOLVER_METHOD, ("self",),
                          captured_inputs.make_resolver_replacement)
              for cls in captured_inputs.classes_with_captured_input_resolution()]
    table += _maybe_merge_call_targets()
    table += _keras_targets()
    return table


def _keras_targets():
    """Keras 3's LossScaleOptimizer, BaseOptimizer, distribution API and
    TensorFlow trainer, Keras 2's Optimizer and its LossScaleOptimizer
    classes, where loaded
    (optional: a Keras without them, or whose classes changed, keeps its
    own refusals)."""
    table = [PatchTarget(cls, keras2_aggregation.ATTRIBUTE,
                         keras2_aggregation.PARAMETERS,
                         keras2_aggregation.make_aggregate_gradients, required=False)
             for cls in keras2_aggregation.keras2_classes()]
    table += [PatchTarget(cls, keras2_loss_scaling.ATTRIBUTE, parameters,
                          keras2_loss_scaling.REPLACEMENTS[cls.__name__],
                          required=False)
              for cls, parameters in keras2_loss_scaling.keras2_classes()]
    keras_class = keras3_loss_scaling.keras_class()
    if keras_class is not None:
        table.append(PatchTarget(keras_class, keras3_loss_scaling.ATTRIBUTE,
                                 keras3_loss_scaling.PARAMETERS, keras3_loss_scaling.make_tf_apply,
                                 required=False))
        table.append(PatchTarget(keras_class, keras3_loss_scaling.CHECK_ATTRIBUTE,
                                 keras3_loss_scaling.CHECK_PARAMETERS,
                                 keras3_loss_scaling.make_check_finite, required=False))
    optimizer_class = keras3_accumulation.keras_class()
    if optimizer_class is not None:
        table.append(PatchTarget(optimizer_class, keras3_accumulation.ATTRIBUTE,
                                 keras3_accumulation.PARAMETERS,
                                 keras3_accumulation.make_backend_apply_gradients,
                                 required=False))
    table += _keras_distribution_targets()
    table += _keras_saving_targets()
    trainer_class = keras3_multi_worker.trainer_class()
    if trainer_class is not None:
        table.append(PatchTarget(trainer_class, keras3_multi_worker.BUILD_ATTRIBUTE,
                                 keras3_multi_worker.BUILD_PARAMETERS,
                                 keras3_multi_worker.make_maybe_symbolic_build,
                                 required=False))
        table.append(PatchTarget(keras3_multi_worker.trainer_module(),
                                 keras3_multi_worker.REDUCE_ATTRIBUTE,
                                 keras3_multi_worker.REDUCE_PARAMETERS,
                                 keras3_multi_worker.make_reduce_per_replica,
                                 required=False))
    return table


def _keras_distribution_targets():
    """Keras 3's `set_distribution` and `initialize` in every loaded module
    holding them, and its TensorFlow data adapter's `get_tf_dataset`, where
    `keras.distribution` is loaded."""
    defining = keras3_distribution.defining_module()
    if defining is None:
        return []
    table = [PatchTarget(module, attribute, parameters, make, required=False,
                         defined_in=defining)
             for attribute, parameters, make in (
                 (keras3_distribution.SET_ATTRIBUTE, keras3_distribution.SET_PARAMETERS,
                  keras3_distribution.make_set_distribution),
                 (keras3_distribution.INITIALIZE_ATTRIBUTE,
                  keras3_distribution.INITIALIZE_PARAMETERS,
                  keras3_distribution.make_initialize))
             for module in keras3_distribution.modules_holding(attribute)]
    adapter = keras3_distribution.adapter_class()
    if adapter is not None:
        table.append(PatchTarget(adapter, keras3_distribution.ADAPTER_ATTRIBUTE,
                                 keras3_distribution.ADAPTER_PARAMETERS,
                                 keras3_distribution.make_get_tf_dataset, required=False))
        table.append(PatchTarget(adapter, *keras3_distribution.ADAPTER_INIT,
                                 keras3_distribution.make_adapter_init, required=False))
    return table


def _keras_saving_targets():
    """Keras 3's saving functions in every loaded module holding them,
    `Model.export`, and BackupAndRestore's and ModelCheckpoint's writes,
    where their modules are loaded."""
    saving = sys.modules.get(keras3_saving.SAVING_MODULE)
    table = [PatchTarget(module, attribute, parameters, make, required=False,
                         defined_in=saving)
             for (attribute, parameters), make in (
                 (keras3_saving.SAVE_MODEL, keras3_saving.make_save_model),
                 (keras3_saving.SAVE_WEIGHTS, keras3_saving.make_save_weights))
             for module in keras3_saving.saving_modules(attribute)]
    for module, class_name, (attribute, parameters), make in (
            (keras3_saving.MODEL_MODULE, "Model", keras3_saving.EXPORT,
             keras3_saving.make_export),
            (keras3_saving.BACKUP_MODULE, "BackupAndRestore", keras3_saving.BACKUP_BEGIN,
             keras3_saving.make_backup_on_train_begin),
            (keras3_saving.BACKUP_MODULE, "BackupAndRestore", keras3_saving.BACKUP_SAVE,
             keras3_saving.make_backup_save_model),
            (keras3_saving.BACKUP_MODULE, "BackupAndRestore", keras3_saving.BACKUP_END,
             keras3_saving.make_backup_on_train_end),
            (keras3_saving.CHECKPOINT_MODULE, "ModelCheckpoint",
             keras3_saving.CHECKPOINT_SAVE, keras3_saving.make_checkpoint_save_model)):
        owner = keras3_saving.defined(module, class_name, attribute)
        if owner is not None:
            table.append(PatchTarget(owner, attribute, parameters, make, required=False))
    return table


def _maybe_merge_call_targets():
    """A target for each loaded module holding TensorFlow's
    `maybe_merge_call` or tfdtape's replacement of it."""
    defined = vars(merge_call_interim).get(merge_calls.ATTRIBUTE)
    tensorflows = original_of(defined) or defined
    holding = merge_calls.modules_holding(
        lambda value: value is tensorflows or original_of(value) is tensorflows)
    return [PatchTarget(module, merge_calls.ATTRIBUTE, merge_calls.PARAMETERS,
                        merge_calls.make_maybe_merge_call,
                        defined_in=merge_call_interim)
            for module in holding]
