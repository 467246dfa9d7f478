"""The defun half of the commit: no per-call resolution of captured variables.

Before the commit, a traced function remembered which captured handles
belonged to distributed variables and, on every call, swapped each for the
handle of the component the current replica should use
(`_resolve_captured_inputs`). The commit deleted that: the tape watches the
distributed variable, and the variable's own logic hands out the right
component at run time. This module finds the mechanism in TensorFlow's
function classes, and makes the replacement that neutralises it.
"""

import importlib

FUNCTION_CLASSES = (
    ("tensorflow.python.eager.polymorphic_function.concrete_function",
     "ConcreteFunction"),
    ("tensorflow.python.eager.polymorphic_function.monomorphic_function",
     "ConcreteFunction"),
    ("tensorflow.python.eager.polymorphic_function.polymorphic_function",
     "Function"),
    ("tensorflow.python.eager.polymorphic_function.atomic_function",
     "AtomicFunction"),
    ("tensorflow.python.eager.function", "ConcreteFunction"),
    ("tensorflow.python.eager.function", "Function"),
    ("tensorflow.python.eager.def_function", "Function"),
)
"""(module, class) pairs that hold, or held, TensorFlow's traced functions."""

RESOLVER_METHOD = "_resolve_captured_inputs"
"""The method the commit deleted."""


def function_classes():
    """The classes of `FUNCTION_CLASSES` that this TensorFlow has."""
    found = []
    for module_name, class_name in FUNCTION_CLASSES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        cls = vars(module).get(class_name)
        if isinstance(cls, type) and cls not in found:
            found.append(cls)
    return found


def classes_with_captured_input_resolution():
    """The function classes that define `_resolve_captured_inputs` themselves."""
    return [cls for cls in function_classes() if RESOLVER_METHOD in vars(cls)]


def make_resolver_replacement(original_resolver):
    """Returns a `_resolve_captured_inputs` that resolves nothing.

    Like the code after the commit, it hands back the captured inputs as
    traced; `original_resolver` is unused but keeps the patch table uniform.
    """
    del original_resolver

    def _resolve_captured_inputs(self):
        """Returns the captured inputs unchanged (tfdtape: the commit's defun)."""
        return self._captured_inputs

    return _resolve_captured_inputs
