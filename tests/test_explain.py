"""tfdtape.explain: the right reason in every cell, from real programs.

The matrix: source kind (plain variable, MirroredVariable, one of its
components, a Keras variable wrapping a MirroredVariable, a tensor) x where
the tape recorded and the gradient is taken (no strategy, replica,
cross-replica, and the two crossings) x cause. Every possible cell is a
program below; `IMPOSSIBLE` lists the others with the reason they cannot
give a None gradient for that cause.
"""

import contextlib

import pytest
import tensorflow as tf

import tfdtape
from keras_models import tf_variable
from tfdtape import explaining
from tfdtape import testing

pytestmark = pytest.mark.per_release

KINDS = ("plain", "mirrored", "component", "keras", "tensor")
CONTEXTS = ("no strategy", "replica", "cross-replica")


class Sources:
    """One source of each kind, made for one test."""

    def __init__(self, strategy):
        self.plain = tf.Variable(2.0, name="plain")
        self.frozen_plain = tf.Variable(2.0, name="frozen", trainable=False)
        with strategy.scope():
            self.mirrored = tf.Variable(2.0, name="mirrored")
            self.frozen_mirrored = tf.Variable(2.0, name="frozen_mirrored",
                                               trainable=False)
            layer = tf.keras.layers.Dense(1, use_bias=False, name="dense")
            layer.build((None, 1))
            layer.kernel.assign([[2.0]])
            self.keras = layer.kernel
            self.frozen_keras = tf.keras.layers.Layer().add_weight(
                name="frozen_kernel", shape=(1, 1), initializer="ones",
                trainable=False)
        self.tensor = tf.constant(2.0)

    def get(self, kind, trainable=True):
        """The source of `kind`; a component is replica 0's (or, in replica
        context, the current replica's)."""
        prefix = "" if trainable else "frozen_"
        if kind == "component":
            return getattr(self, prefix + "mirrored").values[_replica_id()]
        return getattr(self, prefix + kind)


def _replica_id():
    context = tf.distribute.get_replica_context()
    if context is None or not tf.distribute.has_strategy():
        return 0
    return int(tf.get_static_value(context.replica_id_in_sync_group))


def read(source):
    """A differentiable read of the source as a scalar."""
    if isinstance(source, tf.Tensor):
        return tf.reduce_sum(source)
    return tf.reduce_sum(tf_variable(source).read_value())


def in_context(context, strategy, body):
    """Runs body() in `context`; returns its results, one per replica in
    replica context."""
    if context == "replica":
        results = {}

        def replica_fn():
            results[_replica_id()] = body()

        strategy.run(replica_fn)
        return [results[index] for index in sorted(results)]
    if context == "cross-replica":
        with strategy.scope():
            return [body()]
    return [body()]


def reasons(explanations):
    found = set()
    for explanation in explanations:
        assert len(explanation.none_gradients) == 1, str(explanation)
        found.add(explanation.none_gradients[0].reason)
    return found


# Each program records and explains in one context; returns the Explanation.

def not_watched(sources, kind):
    source = sources.get(kind)
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        loss = 3.0 * read(source)
    return tfdtape.explain(tape, loss, source)


def not_read(sources, kind):
    source = sources.get(kind)
    with tf.GradientTape() as tape:
        loss = tf.constant(3.0) * 2.0
    return tfdtape.explain(tape, loss, source)


def not_trainable(sources, kind):
    source = sources.get(kind, trainable=False)
    with tf.GradientTape() as tape:
        loss = 3.0 * read(source)
    return tfdtape.explain(tape, loss, source)


def not_connected(sources, kind):
    source = sources.get(kind)
    with tf.GradientTape() as tape:
        if kind == "tensor":
            tape.watch(source)
        loss = tf.stop_gradient(read(source)) * 2.0
    return tfdtape.explain(tape, loss, source)


def not_connected_after_explicit_watch(sources, kind):
    source = sources.get(kind)
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(source)
        loss = tf.constant(3.0) * 2.0
    return tfdtape.explain(tape, loss, source)


PROGRAMS = {
    explaining.NOT_WATCHED: not_watched,
    explaining.NOT_TRAINABLE: not_trainable,
    explaining.NOT_READ: not_read,
    explaining.NOT_CONNECTED: not_connected,
}

IMPOSSIBLE = {
    (explaining.NOT_READ, "tensor"):
        "a tensor is never read by a tape: an unwatched tensor is "
        "'not watched'",
    (explaining.NOT_TRAINABLE, "tensor"): "a tensor has no trainable flag",
    (explaining.WATCHED_CONTAINER, "plain"): "a plain variable has no container",
    (explaining.WATCHED_CONTAINER, "mirrored"): "it is the container",
    (explaining.WATCHED_CONTAINER, "keras"): "it wraps the container",
    (explaining.WATCHED_CONTAINER, "tensor"): "a tensor has no container",
    (explaining.WRONG_CONTEXT, "plain"):
        "a plain variable resolves to itself in every context",
    (explaining.WRONG_CONTEXT, "tensor"):
        "a tensor resolves to itself in every context",
    (explaining.WRONG_CONTEXT, "component"):
        "a component resolves to itself in every context but replica "
        "context, where it resolves to its container: 'watched as the "
        "container'",
}


CELLS = [(cause, kind, context) for cause in sorted(PROGRAMS) for kind in KINDS
         for context in CONTEXTS if (cause, kind) not in IMPOSSIBLE]


@pytest.mark.parametrize("cause,kind,context", CELLS,
                         ids=["-".join(cell) for cell in CELLS])
@pytest.mark.parametrize("configuration", ["stock", *testing.PATCHED_CONFIGURATIONS],
                         indirect=True)
def test_cause_in_context(strategy, configuration, cause, kind, context):
    sources = Sources(strategy)

    def run():
        return in_context(context, strategy,
                          lambda: PROGRAMS[cause](sources, kind))

    if (configuration == "stock" and context == "cross-replica" and
            kind in ("mirrored", "keras")):
        # Stock TensorFlow cannot differentiate these here at all.
        with pytest.raises(ValueError, match="handle is not available"):
            run()
        return
    assert reasons(run()) == {cause}


def test_every_impossible_cell_names_a_real_cause():
    for cause, kind in IMPOSSIBLE:
        assert cause in explaining.REASONS and kind in KINDS


@pytest.mark.parametrize("kind", ["plain", "mirrored", "component", "keras"])
@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("configuration", testing.PATCHED_CONFIGURATIONS,
                         indirect=True)
def test_explicitly_watched_variable_not_connected(strategy, configuration,
                                                   kind, context):
    """The cross-replica row is the old bug: after tape.watch(mirrored) (all
    components watched) an unconnected source was 'never saw it read'."""
    sources = Sources(strategy)
    explanations = in_context(
        context, strategy,
        lambda: not_connected_after_explicit_watch(sources, kind))
    assert reasons(explanations) == {explaining.NOT_CONNECTED}


def test_a_watched_container_is_not_blamed_on_itself(strategy):
    """In replica context a watched MirroredVariable the target does not
    depend on is 'not connected' (it is the container)."""
    sources = Sources(strategy)
    explanations = in_context("replica", strategy,
                              lambda: not_connected(sources, "mirrored"))
    assert reasons(explanations) == {explaining.NOT_CONNECTED}


def test_other_replicas_component_is_watched_as_the_container(strategy):
    with strategy.scope():
        v = tf.Variable(3.0, name="v")

    def step():
        with tf.GradientTape() as tape:
            loss = v * v
        other = v.values[(_replica_id() + 1) % len(v.values)]
        return tfdtape.explain(tape, loss, other)

    explanations = in_context("replica", strategy, step)
    assert reasons(explanations) == {explaining.WATCHED_CONTAINER}
    assert explanations[0].none_gradients[0].message.startswith(
        "the tape watched its container 'v:0' (a MirroredVariable)")


@pytest.mark.parametrize("kind", ["mirrored", "keras"])
def test_recorded_cross_replica_differentiated_in_replica(strategy, kind):
    """Only replica 0's component was read (the primary); the other replicas
    differentiate their own components."""
    sources = Sources(strategy)
    source = sources.get(kind)
    with strategy.scope():
        tape = tf.GradientTape(persistent=True)
        with tape:
            loss = read(source) * read(source)
    explanations = in_context("replica", strategy,
                              lambda: tfdtape.explain(tape, loss, source))
    assert float(tf.reduce_sum(explanations[0].gradients)) == 4.0
    assert not explanations[0].none_gradients
    assert reasons(explanations[1:]) == {explaining.WRONG_CONTEXT}
    assert "take the gradient where the tape recorded" in str(explanations[1])


@pytest.mark.parametrize("kind", ["mirrored", "keras"])
@pytest.mark.parametrize("configuration", testing.PATCHED_CONFIGURATIONS,
                         indirect=True)
def test_watched_cross_replica_differentiated_in_replica(strategy, configuration,
                                                         kind):
    """tape.watch(v) in cross-replica context watches every component, the
    one each replica differentiates included: still the wrong context, as
    README's table says (it was 'not connected' in replicas 1-3)."""
    sources = Sources(strategy)
    source = sources.get(kind)
    with strategy.scope():
        tape = tf.GradientTape(persistent=True)
        with tape:
            tape.watch(source)
            loss = read(source) * read(source)
    explanations = in_context("replica", strategy,
                              lambda: tfdtape.explain(tape, loss, source))
    assert float(tf.reduce_sum(explanations[0].gradients)) == 4.0
    assert not explanations[0].none_gradients
    assert len(explanations) == 4
    assert reasons(explanations[1:]) == {explaining.WRONG_CONTEXT}


@pytest.mark.parametrize("configuration", testing.PATCHED_CONFIGURATIONS,
                         indirect=True)
def test_a_tape_around_strategy_run_gives_total_derivatives(strategy,
                                                            configuration):
    with strategy.scope():
        v = tf.Variable(3.0, name="spanned")
        unused = tf.Variable(1.0, name="unused")
    for scope in (strategy.scope, contextlib.nullcontext):
        with scope():
            with tf.GradientTape(persistent=True) as tape:
                loss = strategy.reduce("SUM", strategy.run(lambda: v * v),
                                       axis=None)
            explanation = tfdtape.explain(tape, loss, [v, unused])
        assert float(explanation.gradients[0]) == 24.0
        assert explanation.total_derivatives == [v]
        (item,) = explanation.none_gradients
        assert item.source is unused
        assert item.reason == explaining.NOT_READ
        assert str(explanation).splitlines() == [
            "total derivatives (summed over the replicas' components): "
            "MirroredVariable 'spanned:0'",
            "MirroredVariable 'unused:0': " + item.message]


@pytest.mark.parametrize("kind", ["mirrored", "keras"])
def test_recorded_cross_replica_differentiated_outside_the_strategy(
        strategy, configuration, kind):
    """Outside any strategy TensorFlow lets the variable stand for its first
    component (a None here: only component 1 was read, in the wrong context
    for it); tfdtape gives the total derivative there, as in cross-replica
    context."""
    sources = Sources(strategy)
    inner = tf_variable(sources.get(kind))
    with strategy.scope():
        tape = tf.GradientTape(persistent=True)
        with tape:
            loss = tf.reduce_sum(inner.values[1]) * 2.0
    if configuration not in testing.PATCHED_CONFIGURATIONS:
        if kind == "keras":  # stock TensorFlow takes no Keras 3 variable
            return
        explanation = tfdtape.explain(tape, loss, sources.get(kind))
        (item,) = explanation.none_gradients
        assert item.reason == explaining.WRONG_CONTEXT
        assert "outside any strategy" in item.message
        return
    explanation = tfdtape.explain(tape, loss, sources.get(kind))
    assert float(tf.reduce_sum(explanation.gradients)) == 2.0
    assert not explanation.none_gradients
    assert explanation.total_derivatives == [sources.get(kind)]


def test_recorded_in_replica_differentiated_cross_replica_is_per_replica(strategy):
    """Not a None: the container's handle in replica i is component i's, so
    the cross-replica total derivative of replica i's tape is replica i's
    gradient. Shown so that no reason is invented for it."""
    with strategy.scope():
        v = tf.Variable(3.0)
    recorded = {}

    def step():
        tape = tf.GradientTape(persistent=True)
        with tape:
            loss = v * v
        recorded[_replica_id()] = (tape, loss)

    strategy.run(step)
    with strategy.scope():
        for tape, loss in recorded.values():
            explanation = tfdtape.explain(tape, loss, v)
            assert float(explanation.gradients) == 6.0
            assert not explanation.none_gradients


def test_created_outside_strategy_scope_is_not_a_cause(strategy):
    """A plain variable created outside strategy.scope() and read under the
    tape gets its gradient in replica and cross-replica context alike, so
    `explain` has no such reason: an unread one is 'not read'."""
    outside = tf.Variable(2.0)
    gradients = in_context("replica", strategy, lambda: _square_gradient(outside))
    gradients += in_context("cross-replica", strategy,
                            lambda: _square_gradient(outside))
    assert [float(g) for g in gradients] == [4.0] * 5
    assert not hasattr(explaining, "CREATED_OUTSIDE_SCOPE")


def _square_gradient(variable):
    with tf.GradientTape() as tape:
        loss = variable * variable
    return tape.gradient(loss, variable)


def test_explanation_text_names_the_keras_path(strategy):
    sources = Sources(strategy)
    with tf.GradientTape() as tape:
        loss = tf.constant(1.0)
    text = str(tfdtape.explain(tape, loss, [sources.keras]))
    # Keras 3 names it by its path; a Keras 2 (TensorFlow 2.12-2.15) kernel is
    # a tf.Variable, named as TensorFlow named it.
    keras3 = not isinstance(sources.keras, tf.Variable)
    name = "dense/kernel" if keras3 else sources.keras.name
    assert text.startswith(f"{type(sources.keras).__name__} '{name}': the tape "
                           "never saw it read")


def test_reasons_are_public_and_distinct():
    assert len(set(explaining.REASONS)) == 6
    for reason in explaining.REASONS:
        assert isinstance(reason, str) and reason


def test_a_used_tape_is_refused():
    v = tf.Variable(2.0)
    with tf.GradientTape() as tape:
        loss = v * v
    tape.gradient(loss, v)
    with pytest.raises(RuntimeError, match="cannot explain a used tape"):
        tfdtape.explain(tape, loss, v)
