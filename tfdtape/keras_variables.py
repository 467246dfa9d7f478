"""Keras 3 variables: the `tf.Variable` a TensorFlow-backend `keras.Variable` wraps.

From TensorFlow 2.16, `tf.keras` is Keras 3, whose variables are not
`tf.Variable`s: a `keras.Variable` of the TensorFlow backend holds one (a
`MirroredVariable` under `MirroredStrategy`) in its `_value` attribute. tfdtape
treats such a variable as the `tf.Variable` it wraps. Keras 2 (`tf_keras`, and
`tf.keras` up to 2.15) creates `tf.Variable`s directly, so it needs nothing
here.

Keras is never imported by this module: a Keras variable can only exist once
Keras is loaded, so its exported `keras.Variable` is looked up through
`sys.modules` (not a module path inside `keras.src`, which Keras releases
move: 3.16 moved the backend's class out of `keras.src.backend.tensorflow.core`).
"""

import sys

from tensorflow.python.ops import variables
from tensorflow.python.types import core as core_types

from tfdtape import errors
from tfdtape import events

_variable_types = ()  # The backend's Variable classes, once found.


def _known_types():
    """The TensorFlow backend's Variable classes once Keras 3 has loaded
    them, else ().

    Found from the class Keras exports as `keras.Variable` (see
    `_tensorflow_backend_classes`). Looked up until found (Keras may be
    imported after tfdtape), then kept.
    """
    global _variable_types
    if not _variable_types:
        keras_module = sys.modules.get("keras")
        exported = (None if keras_module is None else
                    vars(keras_module).get("Variable"))
        if isinstance(exported, type):
            _variable_types = _tensorflow_backend_classes(exported)
    return _variable_types


def _tensorflow_backend_classes(exported):
    """The most general classes, among `exported`'s bases and subclasses,
    that Keras defines as TensorFlow tensors without being `tf.Variable`s.

    That is the TensorFlow backend's Variable class whether `keras.Variable`
    is that class, a subclass of it (Keras 3.15 and earlier) or its
    backend-independent base (early Keras 3), and nothing on another backend
    or in Keras 2, whose variables are `tf.Variable`s.
    """
    related = [*exported.__mro__, *_subclasses(exported)]
    fitting = [cls for cls in related
               if issubclass(cls, core_types.Tensor)
               and not issubclass(cls, variables.Variable)
               and cls.__module__.partition(".")[0] == "keras"]
    return tuple(dict.fromkeys(
        cls for cls in fitting
        if not any(other is not cls and issubclass(cls, other)
                   for other in fitting)))


def _subclasses(cls):
    """Every class derived from `cls`, however indirectly."""
    found = []
    for subclass in type.__subclasses__(cls):
        found += [subclass, *_subclasses(subclass)]
    return found


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
        raise events.refused(errors.NotWatchableError(errors.message(
            f"Keras variable {label(value)!r} has no tf.Variable yet", symbol,
            "a built Keras variable wrapping a tf.Variable",
            f"{type(inner).__name__} in its _value",
            "Build the layer or model first (call it once, or call build())")))
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
