"""One worker of a two-worker MultiWorkerMirroredStrategy cluster that tries
the spanning step (a tape around strategy.run, applied outside it); prints
what each attempt raised as JSON.

Run by tests/test_multi_worker.py, one fresh process per worker.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf

import tfdtape  # noqa: F401 (installs tfdtape)


def attempt(call):
    """(type name, first line of the message) of what `call` raised, or
    ("returned", repr of the result)."""
    try:
        result = call()
    except Exception as error:
        return type(error).__name__, str(error)
    return "returned", repr(result)


def main():
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        v = tf.Variable(2.0, name="w")
        optimizer = tf.keras.optimizers.SGD(0.1)
        optimizer.build([v])

    def spanning_tape():
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", strategy.run(lambda: v * v), axis=None)
        return tape, loss

    with strategy.scope():
        tape, loss = spanning_tape()
        in_scope = attempt(lambda: tape.gradient(loss, v))
        # Keras 2 all-reduces in apply_gradients unless told not to.
        options = ({"skip_gradients_aggregation": True}
                   if isinstance(optimizer.iterations, tf.Variable) else {})
        apply = attempt(lambda: optimizer.apply_gradients(
            [(tf.constant(1.0), v)], **options))
    tape, loss = spanning_tape()
    no_scope = attempt(lambda: tape.gradient(loss, v))
    print(json.dumps({
        "task": json.loads(os.environ["TF_CONFIG"])["task"]["index"],
        "gradient_in_scope": in_scope,
        "gradient_no_scope": no_scope,
        "apply_in_scope": apply,
        "v": [float(c) for c in strategy.experimental_local_results(v)],
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
