"""The one table of what tfdtape patches in TensorFlow, and what it relies on.

`install()` and `uninstall()` both walk `patch_targets()`, and `info` reports
from it, so the three cannot drift apart.
"""

import dataclasses
import inspect
from typing import Callable, Tuple

from tensorflow.python import pywrap_tfe
from tensorflow.python.distribute import values_util
from tensorflow.python.eager import backprop
from tensorflow.python.eager import tape as tape_module
from tensorflow.python.framework import ops

from tfdtape import compat
from tfdtape import defun
from tfdtape import errors
from tfdtape import gradient_tape
from tfdtape import tape_functions

_MISSING = object()


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
    """
    owner: object
    attribute: str
    parameters: Tuple[str, ...]
    make_replacement: Callable[[Callable], Callable]
    required: bool = True

    @property
    def symbol(self):
        """The attribute's qualified name, e.g. tensorflow.python.eager.tape.watch_variable."""
        if isinstance(self.owner, type):
            return f"{self.owner.__module__}.{self.owner.__qualname__}.{self.attribute}"
        return f"{self.owner.__name__}.{self.attribute}"

    def current(self):
        """The attribute as the owner holds it now (not bound), or None."""
        return vars(self.owner).get(self.attribute)

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
    ]
    table += [PatchTarget(cls, defun.RESOLVER_METHOD, ("self",),
                          defun.make_resolver_replacement)
              for cls in defun.classes_with_captured_input_resolution()]
    return table
