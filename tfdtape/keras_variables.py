"""Keras 3 variables: the `tf.Variable` a TensorFlow-backend `keras.Variable` wraps.

From TensorFlow 2.16, `tf.keras` is Keras 3, whose variables are not
`tf.Variable`s: a `keras.Variable` of the TensorFlow backend holds one (a
`MirroredVariable` under `MirroredStrategy`) in its `_value` attribute. tfdtape
treats such a variable as the `tf.Variable` it wraps. Keras 2 (`tf_keras`, and
`tf.keras` up to 2.15) creates `tf.Variable`s directly, so it needs nothing
here.

Keras is never imported by this module: a Keras variable can only exist once
Keras's TensorFlow backend module is loaded, so it is looked up in
`sys.modules`.
"""

import sys

from tensorflow.python.ops import variables

from tfdtape import errors

BACKEND_MODULES = ("keras.src.backend.tensorflow.core",
                   "keras.backend.tensorflow.core")
"""Where Keras 3 releases define the TensorFlow backend's Variable class."""

_variable_types = ()  # The backend Variable classes, once found.


def _known_types():
    """The TensorFlow backend's Variable classes, once Keras has loaded them.

    Looked up until found (Keras may be imported after tfdtape), then kept.
    """
    global _variable_types
    if not _variable_types:
        _variable_types = tuple(
            vars(module)["Variable"] for module in
            map(sys.modules.get, BACKEND_MODULES)
            if module is not None and "Variable" in vars(module))
    return _variable_types


def is_keras_variable(value):
    """True if `value` is a Keras 3 variable of the TensorFlow backend."""
    types = _known_types()
    return bool(types) and isinstance(value, types)


def inner_or_none(value):
    """What a Keras 3 variable `value` holds as its tf.Variable (possibly None
    before it is built); None for anything that is not a Keras 3 variable."""
    return vars(value).get("_value") if is_keras_variable(value) else None


def wrapped_variable(value, symbol):
    """The `tf.Variable` that the Keras 3 variable `value` wraps, or None.

    Returns None when `value` is not a Keras 3 variable.

    Raises:
        tfdtape.NotWatchableError: `value` is a Keras 3 variable that holds
            no tf.Variable yet (it was never built).
    """
    if not is_keras_variable(value):
        return None
    inner = inner_or_none(value)
    if not isinstance(inner, variables.Variable):
        raise errors.NotWatchableError(errors.message(
            f"Keras variable {label(value)!r} has no tf.Variable yet", symbol,
            "a built Keras variable wrapping a tf.Variable",
            f"{type(inner).__name__} in its _value",
            "Build the layer or model first (call it once, or call build())"))
    return inner


def unwrap(value, symbol):
    """`value` itself, or the `tf.Variable` it wraps if it is a Keras 3 variable."""
    inner = wrapped_variable(value, symbol)
    return value if inner is None else inner


def label(value):
    """A variable's name for people: a Keras variable's path (`dense/kernel`),
    else its TensorFlow name, else its type."""
    if is_keras_variable(value):
        return str(getattr(value, "path", None) or value.name)
    return str(getattr(value, "name", type(value).__name__))
