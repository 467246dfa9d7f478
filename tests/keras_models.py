"""Keras models and helpers shared by the Keras tests.

`keras_module(name)` gives `tf.keras` (Keras 3 from TensorFlow 2.16, Keras 2
before) or `tf_keras` (Keras 2 for TensorFlow 2.16+, skipped with a reason
where it is not installed).
"""

import numpy as np
import pytest
import tensorflow as tf


def is_keras3(keras):
    """True when `keras` is Keras 3 (its variables wrap tf.Variables)."""
    return not issubclass(keras.Variable if hasattr(keras, "Variable")
                          else tf.Variable, tf.Variable)


KERAS_MODULES = ("tf.keras", "tf_keras") if is_keras3(tf.keras) else ("tf.keras",)
"""The Keras modules the tests run with: `tf.keras`, and where that is Keras 3
(TensorFlow 2.16+) also `tf_keras`, Keras 2's package there. Before 2.16
`tf.keras` is Keras 2 itself."""

TOKENS = np.array([[1, 2, 3], [4, 5, 1], [7, 8, 9], [1, 1, 2],
                   [0, 3, 6], [9, 9, 4], [2, 5, 8], [6, 0, 1]], np.int32)
LABELS = np.array([[1.0], [0.0], [2.0], [1.0], [0.5], [1.5], [0.0], [2.5]],
                  np.float32)


def keras_module(name):
    """`tf.keras`, or the installed `tf_keras` (the test skips without it)."""
    if name == "tf.keras":
        return tf.keras
    return pytest.importorskip(name, reason=f"{name} is not installed")


def tf_variable(variable):
    """The tf.Variable a Keras variable is (Keras 2) or wraps (Keras 3)."""
    return variable if isinstance(variable, tf.Variable) else variable.value


def copies(variable):
    """Every local component's value of a (Keras) variable, as NumPy arrays:
    one per replica of a distributed variable, else the one value."""
    inner = tf_variable(variable)
    return [np.asarray(component) for component in getattr(inner, "values", (inner,))]


def embedding_model(keras):
    """Embedding -> Flatten -> Dense(5, tanh) -> Dense(1), fixed weights.

    The embedding's gradient is sparse (IndexedSlices); the dense layers'
    are dense.
    """
    model = keras.Sequential([
        keras.Input((3,), dtype="int32"),
        keras.layers.Embedding(10, 4, name="embedding"),
        keras.layers.Flatten(),
        keras.layers.Dense(5, activation="tanh", name="hidden"),
        keras.layers.Dense(1, name="output"),
    ])
    rng = np.random.default_rng(7)
    model.set_weights([rng.normal(0.0, 0.5, w.shape).astype(np.float32)
                       for w in model.get_weights()])
    return model


def mean_squared_error(model, tokens=TOKENS, labels=LABELS):
    error = model(tokens) - labels
    return tf.reduce_mean(error * error)
