"""The checks `python -m tfdtape verify` runs: the commit's semantics, observed.

Each check observes one behaviour and describes it in a short word or phrase
(what the tape watched, a gradient, an error). It runs in every
configuration of `tfdtape.testing`; it passes when tfdtape, with and without
TensorFlow's native resolver, gives `expected`, and, for a discriminating
check, the pre-seed control gives something else (otherwise the check could
not tell a broken tfdtape from none). The stock column is informational.
"""

import dataclasses
from collections.abc import Callable

import tensorflow as tf
from tensorflow.python.eager import backprop
from tensorflow.python.eager import tape as tape_module

from tfdtape import captured_inputs
from tfdtape import patching
from tfdtape import resolution
from tfdtape.cli import multi_worker_check

COEFFICIENTS = tuple(float(i + 1) for i in range(64))  # one per replica, up to 64


@dataclasses.dataclass(frozen=True)
class Check:
    """One verification check.

    Attributes:
        name: a stable identifier (used by --only and in reports).
        description: one sentence on what the check shows.
        observe: called with a MirroredStrategy inside a configuration;
            returns the observation, a short string.
        expected: the observation the commit's semantics give.
        discriminating: whether the pre-seed control must observe something
            else. False for behaviour TensorFlow had before the commit too.
    """
    name: str
    description: str
    observe: Callable[[tf.distribute.Strategy], str]
    expected: str
    discriminating: bool = True


def observe_safely(check, strategy):
    """Runs `check.observe`; an exception becomes the observation 'raised X: ...'."""
    try:
        return check.observe(strategy)
    except Exception as error:
        first_line = str(error).splitlines()[0] if str(error) else ""
        return f"raised {type(error).__name__}: {first_line[:72]}"


def _replica_id():
    context = tf.distribute.get_replica_context()
    return int(tf.get_static_value(context.replica_id_in_sync_group))


def _describe_watched(watched, container):
    """'container', 'own component', 'all components' or the types seen."""
    watched = list(watched)
    if len(watched) == 1 and watched[0] is container:
        return "container"
    if len(watched) == 1 and any(watched[0] is c for c in container.values):
        return "own component"
    if (len(watched) == len(container.values) and
            all(w is c for w, c in zip(watched, container.values))):
        return "all components"
    return "watched " + ", ".join(type(w).__name__ for w in watched)


def _per_replica(strategy, observe_replica, traced=False):
    """Runs observe_replica() in every replica (inside a tf.function when
    `traced`); returns the distinct observations, joined by ' / '."""
    answers = {}

    def replica_fn():
        answers[_replica_id()] = observe_replica()

    if traced:
        replica_fn = tf.function(replica_fn, autograph=False)
    strategy.run(replica_fn)
    return " / ".join(sorted(set(answers.values())))


def _replica_reads(traced):
    def observe(strategy):
        with strategy.scope():
            v = tf.Variable(3.0)

        def observe_replica():
            with tf.GradientTape() as tape:
                v * v
            return _describe_watched(resolution.watched_by(tape), v)

        return _per_replica(strategy, observe_replica, traced)
    return observe


def _replica_reset(strategy):
    with strategy.scope():
        v = tf.Variable(3.0)
        w = tf.Variable(2.0)

    def observe_replica():
        with tf.GradientTape() as tape:
            v * v
            tape.reset()
            w * w
        return _describe_watched(resolution.watched_by(tape), w)

    return _per_replica(strategy, observe_replica)


def _captured_in_function(strategy):
    with strategy.scope():
        v = tf.Variable(0.0)
    for index, component in enumerate(v.values):
        component.assign(float(index + 1))
    square = tf.function(lambda: v * v, autograph=False)

    def observe_replica():
        with tf.GradientTape() as tape:
            loss = square()
        own = float(loss) == float(_replica_id() + 1) ** 2
        return (("own component read" if own else "wrong component read") +
                ", " + _describe_watched(resolution.watched_by(tape), v))

    return _per_replica(strategy, observe_replica)


def _cross_replica_tape_call(strategy):
    with strategy.scope():
        v = tf.Variable(3.0)
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape_module.watch_variable(tape._tape, v)
    return _describe_watched(resolution.watched_by(tape), v)


def _cross_replica_watch(strategy):
    with strategy.scope():
        v = tf.Variable(3.0)
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(v)
    return _describe_watched(resolution.watched_by(tape), v)


def _cross_replica_gradient(strategy):
    with strategy.scope():
        v = tf.Variable(3.0)
        with tf.GradientTape() as tape:
            loss = tf.add_n([c * x for c, x in zip(COEFFICIENTS, v.values)])
        gradient = float(tape.gradient(loss, v))
    if gradient == sum(COEFFICIENTS[:len(v.values)]):
        return "sum over components"
    return f"gradient {gradient:g}"


def _sync_on_read_gradient(strategy):
    with strategy.scope():
        v = tf.Variable(3.0, synchronization=tf.VariableSynchronization.ON_READ,
                        aggregation=tf.VariableAggregation.SUM)
        with tf.GradientTape() as tape:
            loss = tf.add_n(list(v.values))
        try:
            tape.gradient(loss, v)
        except ValueError as error:
            if "Compute the gradient inside strategy.run" in str(error):
                return "refused, naming strategy.run"
            raise
    return "no error"


def _keras_cross_replica_gradient(strategy):
    with strategy.scope():
        layer = tf.keras.layers.Dense(1, use_bias=False)
        layer.build((None, 2))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(tf.constant([[1.0, 2.0], [3.0, 5.0]])))
        gradient = tape.gradient(loss, layer.trainable_variables)[0]
    if gradient.numpy().ravel().tolist() == [4.0, 7.0]:
        return "one-device gradient"
    return f"gradient {gradient.numpy().ravel().tolist()}"


def _tape_around_strategy_run(strategy):
    with strategy.scope():
        v = tf.Variable(3.0)
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", strategy.run(lambda: v * v), axis=None)
        gradient = tape.gradient(loss, v)
    return _describe_total(gradient, 6.0 * strategy.num_replicas_in_sync,
                           tape.watched_variables(), v)


def _tape_around_strategy_run_no_scope(strategy):
    with strategy.scope():
        v = tf.Variable(3.0)
    tapes = []

    @tf.function(autograph=False)
    def step():
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", strategy.run(lambda: v * v), axis=None)
        tapes.append(tape)
        return tape.gradient(loss, v)

    gradient = step()
    return _describe_total(gradient, 6.0 * strategy.num_replicas_in_sync,
                           tapes[0].watched_variables(), v)


def _describe_total(gradient, total, watched, variable):
    """'total over replicas, watched once' or what was found instead."""
    if gradient is None:
        return "gradient None"
    if float(gradient) != total:
        return f"gradient {float(gradient):g}"
    if len(watched) != 1 or watched[0] is not variable:
        return f"total over replicas, watched {len(watched)} times"
    return "total over replicas, watched once"


def _apply_in_cross_replica_context(strategy):
    keras = tf.keras
    with strategy.scope():
        layer = keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
        layer.build((None, 2))
        optimizer = keras.optimizers.SGD(0.5)
        kernel = layer.trainable_variables[0]
        # Keras 2 (its variables are tf.Variables) all-reduces in
        # apply_gradients through merge_call unless told the gradient is
        # aggregated already.
        options = ({"skip_gradients_aggregation": True}
                   if isinstance(kernel, tf.Variable) else {})
        optimizer.apply_gradients([(tf.constant([[1.0], [2.0]]), kernel)],
                                  **options)
    inner = kernel if isinstance(kernel, tf.Variable) else kernel.value
    copies = [c.numpy().ravel().tolist() for c in inner.values]
    iterations = int(optimizer.iterations.numpy())
    if copies == [[0.5, 0.0]] * len(copies) and iterations == 1:
        return "applied to every replica once"
    return f"replicas {copies}, iterations {iterations}"


def _creator_stack(strategy):
    created = []

    @tf.function(autograph=False)
    def make():
        if not created:
            created.append(tf.Variable(1.0))
        return created[0].read_value()

    with strategy.scope():
        make()
    return type(created[0]).__name__


def _no_captured_input_resolution(strategy):
    del strategy
    remaining = [
        cls.__qualname__
        for cls in captured_inputs.classes_with_captured_input_resolution()
        if vars(cls)[captured_inputs.RESOLVER_METHOD].__module__ != captured_inputs.__name__]
    if remaining:
        return "per-call resolution in " + ", ".join(remaining)
    return "no per-call resolution"


def _uninstall_restores(strategy):
    del strategy
    owners = [(tape_module, "watch_variable"), (tape_module, "variable_accessed"),
              (backprop.GradientTape, "watch"), (backprop.GradientTape, "gradient")]
    was_installed = patching.is_installed()
    patching.uninstall()
    originals = [vars(owner)[name] for owner, name in owners]
    try:
        patching.install()
        patching.uninstall()
        same = all(vars(owner)[name] is original
                   for (owner, name), original in zip(owners, originals))
    finally:
        if was_installed:
            patching.install()
    return "originals restored" if same else "originals lost"


CHECKS = (
    Check("replica_context_eager",
          "Inside strategy.run, an eager read watches the MirroredVariable.",
          _replica_reads(traced=False), "container"),
    Check("replica_context_tf_function",
          "Inside a tf.function step under strategy.run, a read watches the "
          "MirroredVariable.", _replica_reads(traced=True), "container"),
    Check("watched_variables_reset",
          "After GradientTape.reset(), watched_variables() holds the container "
          "read since.", _replica_reset, "container"),
    Check("captured_variable_tf_function",
          "A tf.function capturing a MirroredVariable reads each replica's own "
          "component and the tape watches the container.",
          _captured_in_function, "own component read, container"),
    Check("cross_replica_tape_call",
          "In cross-replica context, tape.watch_variable watches every local "
          "component.", _cross_replica_tape_call, "all components"),
    Check("cross_replica_watch",
          "In cross-replica context, GradientTape.watch(mirrored) watches "
          "every local component.", _cross_replica_watch, "all components"),
    Check("cross_replica_gradient",
          "In cross-replica context, the gradient for a MirroredVariable is the "
          "sum over its components (component i read with coefficient i+1).",
          _cross_replica_gradient, "sum over components"),
    Check("sync_on_read_gradient_error",
          "In cross-replica context, a SyncOnRead gradient source is refused "
          "with advice to use strategy.run.", _sync_on_read_gradient,
          "refused, naming strategy.run"),
    Check("keras_cross_replica_gradient",
          "A tf.keras layer's gradient in cross-replica context (strategy.scope(),"
          " no strategy.run) equals the one-device gradient.",
          _keras_cross_replica_gradient, "one-device gradient"),
    Check("tape_around_strategy_run",
          "A tape around an eager strategy.run in cross-replica context records "
          "every replica: the gradient is their total, the variable watched "
          "once.", _tape_around_strategy_run, "total over replicas, watched once"),
    Check("tape_around_strategy_run_no_scope",
          "The same step as a tf.function with no strategy.scope() around it "
          "(TensorFlow gives replica 0's share or None).",
          _tape_around_strategy_run_no_scope, "total over replicas, watched once"),
    Check("apply_gradients_cross_replica",
          "A Keras optimizer applies gradients in cross-replica context "
          "(maybe_merge_call calls its function with the strategy).",
          _apply_in_cross_replica_context, "applied to every replica once"),
    Check("variable_creator_stack",
          "A variable created in a tf.function traced under strategy.scope() "
          "is a MirroredVariable (FuncGraph inherits the creator stack).",
          _creator_stack, "MirroredVariable", discriminating=False),
    Check("defun_captured_input_resolution",
          "No traced-function class resolves captured distributed variables "
          "per call (absent, or neutralised by tfdtape).",
          _no_captured_input_resolution, "no per-call resolution",
          discriminating=False),
    Check("uninstall_restores_identity",
          "uninstall() puts back TensorFlow's exact original function objects.",
          _uninstall_restores, "originals restored", discriminating=False),
)

MULTI_WORKER_CHECKS = (
    Check("spanning_step_two_workers",
          "On two local worker processes (MultiWorkerMirroredStrategy), a tape "
          "around strategy.run gives the whole job's gradient on both, applied "
          "alike in cross-replica context (opt-in: verify --multi-worker).",
          multi_worker_check.observe, multi_worker_check.EXPECTED),
)
"""Checks that start worker processes: run with `verify --multi-worker`."""
