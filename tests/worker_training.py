"""Training across workers as users write it, and the one-device reference.

Shared by tests/test_multi_worker_spanning.py (the reference: one device on
the global batch) and the worker processes it starts
(`multi_worker_spanning_process.py`: MultiWorkerMirroredStrategy, one
replica per worker), so both sides build the same model on the same data.

A case is a dict:
- loop: "spanning" (the tape around strategy.run, the apply in
  cross-replica context) or "tutorial" (tape and apply inside strategy.run);
- mode: "eager" or "tf_function";
- optimizer: "sgd" or "adam" (Keras 3);
- scope: whether strategy.scope() is open around the step;
- target: "sum" (strategy.reduce SUM of tf.nn.compute_average_loss),
  "mean" (strategy.reduce MEAN of per-replica means), "local_sum"
  (tf.add_n of experimental_local_results of compute_average_loss),
  "sum_axis" (strategy.reduce SUM, axis=0, of the per-example losses over
  the global batch) or "mean_axis" (MEAN, axis=0, of the per-example losses);
- model: "dense" (Dense(4, tanh), Dense(1)) or "embedding" (Embedding,
  Flatten, Dense(1): a sparse gradient);
- keras: "tf.keras" (Keras 3 from TensorFlow 2.16) or "tf_keras" (Keras 2;
  `skip`: its apply told skip_gradients_aggregation=True);
- l2: whether L2 * the kernels' squared sum is added outside strategy.run
  ("varying": times this worker's own local loss, which no one count fits);
- spare: whether the model holds a Dense layer the loss does not use;
- transform: what the step does to the gradients before the apply: "none",
  "clip" (tf.clip_by_global_norm to CLIP) or "local_scale" (times this
  worker's local loss: different on every worker);
- nested: whether a second tape records around the step's tape;
- apply: "inside" to apply the spanning step's gradients inside
  strategy.run (each worker's copy of the total all-reduced again).
Every target is, on one device, the mean squared error over the global
batch (plus the L2 term once).
"""

import numpy as np
import tensorflow as tf

GLOBAL_BATCH = 12
FEATURES = np.linspace(-1.0, 1.0, GLOBAL_BATCH * 3, dtype=np.float32).reshape(-1, 3)
TOKENS = (np.arange(GLOBAL_BATCH * 3, dtype=np.int32).reshape(-1, 3) * 7) % 10
LABELS = (np.sin(np.arange(GLOBAL_BATCH, dtype=np.float32)) * 0.5).reshape(-1, 1)
L2 = 0.01
CLIP = 0.5
STEPS = 3


def keras_of(case):
    if case.get("keras") == "tf_keras":
        import tf_keras
        return tf_keras
    return tf.keras


def inputs(case):
    """The global batch's inputs for the case's model."""
    return TOKENS if case.get("model") == "embedding" else FEATURES


def build(case):
    """(model, trainable variables in a fixed order, optimizer)."""
    keras = keras_of(case)
    if case.get("model") == "embedding":
        layers = [keras.Input((3,), dtype="int32"),
                  keras.layers.Embedding(10, 4, name="embedding"),
                  keras.layers.Flatten(), keras.layers.Dense(1, name="out")]
    else:
        layers = [keras.Input((3,)),
                  keras.layers.Dense(4, activation="tanh", name="hidden"),
                  keras.layers.Dense(1, name="out")]
    model = keras.Sequential(layers)
    rng = np.random.default_rng(3)
    model.set_weights([rng.normal(0.0, 0.5, w.shape).astype(np.float32)
                       for w in model.get_weights()])
    variables = list(model.trainable_variables)
    if case.get("spare"):
        spare = keras.layers.Dense(2, name="spare")
        spare.build((None, 3))
        spare.set_weights([np.full((3, 2), 0.25, np.float32), np.zeros(2, np.float32)])
        variables += list(spare.trainable_variables)
    optimizer = (keras.optimizers.Adam(0.05) if case["optimizer"] == "adam"
                 else keras.optimizers.SGD(0.1))
    optimizer.build(variables)
    return model, variables, optimizer


def l2_term(model):
    return L2 * tf.add_n([tf.reduce_sum(tf.square(layer.kernel))
                          for layer in model.layers if hasattr(layer, "kernel")])


def apply_options(case):
    """Keyword arguments of the case's apply_gradients."""
    return {"skip_gradients_aggregation": True} if case.get("skip") else {}


def one_device(case):
    """The weights after the case's steps (STEPS unless it says "steps") on
    one device over the global batch."""
    model, variables, optimizer = build(case)
    for _ in range(case.get("steps", STEPS)):
        with tf.GradientTape() as tape:
            error = model(inputs(case)) - LABELS
            loss = tf.reduce_mean(tf.reduce_sum(error * error, axis=1))
            if case.get("l2"):
                loss += l2_term(model)
        gradients = transformed(case, tape.gradient(loss, variables))
        optimizer.apply_gradients(zip(gradients, variables))
    return [v.numpy() for v in variables]


def transformed(case, gradients, local=None):
    """`gradients` as the case's step changes them before the apply
    (`local`: this worker's own local loss)."""
    if case.get("transform") == "clip":
        present = [g for g in gradients if g is not None]
        clipped = iter(tf.clip_by_global_norm(present, CLIP)[0])
        return [None if g is None else next(clipped) for g in gradients]
    if case.get("transform") == "local_scale":
        return [None if g is None else g * local for g in gradients]
    return gradients
