"""Generated Keras training programs and an oracle that knows nothing of
tfdtape: NumPy's float64 math of one device training on the global batch.

A `TrainingProgram` is one choice per dimension of `DIMENSIONS`: how the
model trains (`model.fit`; TensorFlow's tutorial step, the tape and the
apply inside `strategy.run`, eagerly or in a `tf.function`; the tape around
`strategy.run` with the apply after it, eagerly or traced), the optimizer
(SGD, Adam), Keras 3's gradient accumulation (none, 2 steps), the
optimizer's clip option (none, `clipnorm`, `global_clipnorm`, `clipvalue`),
and the strategy (none; MirroredStrategy over the process's devices;
MultiWorkerMirroredStrategy, whose programs run on a loopback cluster).

The model is one Dense(1) layer on 3 features, its loss the mean squared
error over the global batch of `GLOBAL_BATCH` rows, trained for `STEPS`
steps. `oracle(program, replicas, keras3)` works out the kernel, the bias
and the optimizer's iteration counter after them. One case is not one
device by definition: a Keras 3 optimizer that clips inside the replicas
(the tutorial step or `fit`, no accumulation, several replicas) clips each
replica's share of the gradient before the sum (Keras 3 documents its clip
as applied to the gradients it is given; `tfdtape run` warns of it); the
oracle then sums the clipped shares, as that program asks. With
accumulation the clip is in Keras's update function, of the accumulated
average, so one device's again; tf_keras (Keras 2) optimizers all-reduce
before they clip.
"""

import dataclasses
import random

import numpy as np

import generated_programs as gp

GLOBAL_BATCH = 12
STEPS = 4
FEATURES = np.array([[np.sin(3.0 * i + j) * (1 + i % 3) for j in range(3)]
                     for i in range(STEPS * GLOBAL_BATCH)], dtype=np.float32)
LABELS = (FEATURES @ np.array([[1.5], [-2.0], [0.75]], np.float32) + 2.0).astype(np.float32)
OVERFLOW_ROW = 2 * GLOBAL_BATCH - 1
"""The row whose label is inf in a program with `overflow`: the second
step's last, in the last replica's share."""
KERNEL = np.array([[0.5], [-0.25], [0.125]], np.float32)
BIAS = np.array([0.1], np.float32)
LEARNING_RATE = {"sgd": 0.1, "adam": 0.05}
CLIP = {"clipnorm": 0.5, "global_clipnorm": 0.5, "clipvalue": 0.2}
BETA_1, BETA_2, EPSILON = 0.9, 0.999, 1e-7
"""Keras's Adam defaults."""

DIMENSIONS = {
    "loop": ("spanning", "spanning_traced", "tutorial", "tutorial_traced", "fit"),
    "optimizer": ("sgd", "adam"),
    "accumulation": (0, 2),
    "clipping": ("none", "clipnorm", "global_clipnorm", "clipvalue"),
    "strategy": ("mirrored", "none", "multi_worker"),
    "loss_scale": ("none", "dynamic"),
    "steps_per_execution": (1, 2),
    "scope": ("inside", "outside"),
    "overflow": (False, True),
}
"""Each dimension's choices; a program's first choice of each is `SIMPLEST`.
`loss_scale`: the optimizer inside Keras 3's `LossScaleOptimizer` (the
loss scaled by `optimizer.scale_loss` in the custom loops, by `fit`
itself). `steps_per_execution`: `fit`'s (steps per traced call); more
than one only where the strategy has one replica: Keras 3.15's `fit` on
TensorFlow 2.21 with `steps_per_execution` > 1 under a strategy of several
replicas fails on stock TensorFlow in every form ("You must feed a value for
placeholder tensor '.../while/cond/Placeholder'"), and with tfdtape alike
(`test_keras_accumulation.py` holds it; docs/limits.md).
`scope`: whether a custom loop's steps run inside `strategy.scope()` or
outside it (as TensorFlow's tutorial calls them). `overflow`: with loss
scaling, one label inf (`OVERFLOW_ROW`), so that step's gradient is not
finite on one replica only: one device skips the step (and halves the
scale)."""

SIMPLEST = {name: choices[0] for name, choices in DIMENSIONS.items()}


@dataclasses.dataclass(frozen=True)
class TrainingProgram(gp.Spec):
    loop: str
    optimizer: str
    accumulation: int
    clipping: str
    strategy: str
    loss_scale: str = "none"
    steps_per_execution: int = 1
    scope: str = "inside"
    overflow: bool = False

    @property
    def traced(self):
        return self.loop.endswith("_traced")

    @property
    def labels(self):
        """`LABELS`, with `OVERFLOW_ROW`'s inf where the program overflows."""
        labels = LABELS.copy()
        if self.overflow:
            labels[OVERFLOW_ROW] = np.inf
        return labels


def pinned(program, keras3, replicas):
    """`program` with each choice that cannot apply to its others set to
    the one that stands for it: without Keras 3 no accumulation and no loss
    scaling (Keras 2 has neither in this form); steps per execution are
    `fit`'s, and one under a strategy of several `replicas` (see
    `DIMENSIONS`); the scope choice is a custom loop's under a strategy; an
    overflow only with loss scaling (without it the weights are inf)."""
    changes = {}
    if not keras3:
        changes.update(accumulation=0, loss_scale="none")
    if not keras3 or program.loss_scale == "none":
        changes.update(overflow=False)
    if program.loop != "fit" or (program.strategy != "none" and replicas > 1):
        changes.update(steps_per_execution=1)
    if program.loop == "fit" or program.strategy == "none":
        changes.update(scope="inside")
    return dataclasses.replace(program, **changes)


def generate(seed, count, strategies=("mirrored", "none"), keras3=True, replicas=1):
    """`count` programs drawn with `random.Random(seed)`, each strategy
    among `strategies` (of `replicas` replicas), pinned for them and the
    Keras there is."""
    draw = random.Random(seed)
    programs = []
    for _ in range(count):
        choices = {name: draw.choice(options) for name, options in DIMENSIONS.items()}
        choices["strategy"] = draw.choice(strategies)
        programs.append(pinned(TrainingProgram(**choices), keras3, replicas))
    return programs


def shrink(program, fails, keras3=True, replicas=1):
    """The program closest to `SIMPLEST` (fewest choices away from it) that
    still `fails`, moving one choice at a time; the strategy is kept."""
    return gp.shrink_towards(program, {name: choice for name, choice in SIMPLEST.items()
                                       if name != "strategy"}, fails,
                             adjust=lambda candidate: pinned(candidate, keras3, replicas))


# The oracle ------------------------------------------------------------------


def clips_inside_replicas(program, replicas, keras3):
    """Whether the program's optimizer clips each replica's share (see the
    module's docstring)."""
    return (keras3 and program.clipping != "none" and not program.accumulation and
            program.loop in ("fit", "tutorial", "tutorial_traced") and
            program.strategy != "none" and replicas > 1)


def oracle(program, replicas, keras3):
    """{"kernel": [3 floats], "bias": float, "iterations": int,
    "copies_agree": True} after `STEPS` steps, `replicas` the strategy's
    replicas in sync (over every worker). A step whose gradient is not
    finite is skipped (loss scaling: its optimizer is not called)."""
    weights = [KERNEL.astype(np.float64), BIAS.astype(np.float64)]
    accumulated = [np.zeros_like(w) for w in weights]
    moments = [[np.zeros_like(w) for w in weights] for _ in range(2)]
    calls = updates = 0
    per_replica = clips_inside_replicas(program, replicas, keras3)
    for step in range(STEPS):
        rows = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
        x, y = FEATURES[rows].astype(np.float64), program.labels[rows].astype(np.float64)
        with np.errstate(all="ignore"):
            if per_replica:
                shares = zip(np.split(x, replicas), np.split(y, replicas))
                shares = [_clip(program, _gradients(weights, *share)) for share in shares]
                gradients = [sum(parts) for parts in zip(*shares)]
            else:
                gradients = _gradients(weights, x, y)
        if not all(np.all(np.isfinite(g)) for g in gradients):
            continue
        calls += 1
        if program.accumulation:
            if calls % program.accumulation:
                accumulated = [a + g for a, g in zip(accumulated, gradients)]
                continue
            gradients = [(a + g) / program.accumulation
                         for a, g in zip(accumulated, gradients)]
            accumulated = [np.zeros_like(w) for w in weights]
        if not per_replica:
            gradients = _clip(program, gradients)
        updates += 1
        weights = _update(program, weights, gradients, moments, updates)
    return {"kernel": weights[0].ravel().tolist(), "bias": float(weights[1][0]),
            "iterations": updates, "copies_agree": True}


def _gradients(weights, x, y):
    """d/d(kernel, bias) of sum((x kernel + bias - y)^2) / GLOBAL_BATCH: the
    global batch's mean, or a share's part of it."""
    error = x @ weights[0] + weights[1] - y
    return [2.0 * x.T @ error / GLOBAL_BATCH, 2.0 * error.sum(axis=0) / GLOBAL_BATCH]


def _clip(program, gradients):
    limit = CLIP.get(program.clipping)
    if program.clipping == "clipnorm":
        return [g * limit / max(np.linalg.norm(g), limit) for g in gradients]
    if program.clipping == "global_clipnorm":
        norm = np.sqrt(sum(np.sum(g * g) for g in gradients))
        return [g * limit / max(norm, limit) for g in gradients]
    if program.clipping == "clipvalue":
        return [np.clip(g, -limit, limit) for g in gradients]
    return gradients


def _update(program, weights, gradients, moments, step):
    rate = LEARNING_RATE[program.optimizer]
    if program.optimizer == "sgd":
        return [w - rate * g for w, g in zip(weights, gradients)]
    first, second = moments
    alpha = rate * np.sqrt(1 - BETA_2 ** step) / (1 - BETA_1 ** step)
    updated = []
    for index, (w, g) in enumerate(zip(weights, gradients)):
        first[index] = first[index] + (g - first[index]) * (1 - BETA_1)
        second[index] = second[index] + (g * g - second[index]) * (1 - BETA_2)
        updated.append(w - first[index] * alpha / (np.sqrt(second[index]) + EPSILON))
    return updated


def same(found, expected):
    """Whether a run's result is the oracle's: the same keys, the iteration
    count and agreement exactly, the weights within float32 rounding over
    `STEPS` steps."""
    if not isinstance(found, dict) or found.keys() != expected.keys():
        return False
    return (found["iterations"] == expected["iterations"] and
            found["copies_agree"] is expected["copies_agree"] and
            np.allclose(found["kernel"], expected["kernel"], rtol=1e-4, atol=1e-5) and
            np.isclose(found["bias"], expected["bias"], rtol=1e-4, atol=1e-5))
