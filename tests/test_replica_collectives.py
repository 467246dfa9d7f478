"""`ReplicaContext.all_reduce` inside the replicas of a `strategy.run` that a
tape around it records (tfdtape.collectives): the gradient over
every replica, against closed-form single-device math, eagerly and in a
`tf.function`; synchronized BatchNormalization against one device on the
global batch.

Stock TensorFlow cannot differentiate it there: its tape records none of
the replicas (None) or, inside the scope, raises (the handle error; eagerly
the reduction's own `LookupError`).
"""

import numpy as np
import pytest
import tensorflow as tf

from conftest import DEVICES
from keras_models import is_keras3
from tfdtape.testing import PATCHED_CONFIGURATIONS

pytestmark = pytest.mark.per_release

REPLICAS = len(DEVICES)
V0 = np.array([1.0, 2.0], np.float32)


def replica_x(r):
    return np.array([1.0, -1.0], np.float32) * (r + 1)


def replica_loss(x, v, reduce_op):
    """Replica r's share: sum((all_reduce(x_s * v)) ** 2 * x_r)."""
    y = tf.distribute.get_replica_context().all_reduce(reduce_op, x * v)
    return tf.reduce_sum(y * y * x)


def oracle_gradient(reduce_op):
    """d/dv of sum_r sum(y ** 2 * x_r), y = sum_s x_s * v (/N for MEAN),
    by hand: 2 y (sum_s x_s) (sum_r x_r) (/N)."""
    xs = sum(replica_x(r) for r in range(REPLICAS))
    scale = 1.0 / REPLICAS if reduce_op == "MEAN" else 1.0
    y = xs * V0 * scale
    return 2.0 * y * xs * scale * xs


def placed(strategy, value_fn):
    """Per-replica values of `value_fn(replica id)`, each on its replica's
    device (experimental_distribute_values_from_function leaves them all on
    the default device)."""
    values = strategy.experimental_distribute_values_from_function(
        lambda context: tf.constant(value_fn(context.replica_id_in_sync_group)))
    return strategy.run(tf.identity, args=(values,))


def per_replica_x(strategy):
    return placed(strategy, replica_x)


STEPS = {"eager": lambda f: f, "tf_function": tf.function}


@pytest.mark.parametrize("reduce_op", ["SUM", "MEAN"])
@pytest.mark.parametrize("mode", sorted(STEPS))
@pytest.mark.parametrize("scope", ["in_scope", "no_scope"])
def test_all_reduce_in_the_replicas_is_differentiated_over_all_of_them(
        strategy, configuration, reduce_op, mode, scope):
    with strategy.scope():
        v = tf.Variable(V0)
    inputs = per_replica_x(strategy)

    def step():
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", strategy.run(
                replica_loss, args=(inputs, v, reduce_op)), axis=None)
        return tape.gradient(loss, v)

    step = STEPS[mode](step)
    context = strategy.scope() if scope == "in_scope" else _no_scope()
    if configuration not in PATCHED_CONFIGURATIONS:
        with context:
            try:
                gradient = step()
            except (ValueError, LookupError, tf.errors.InvalidArgumentError):
                return  # stock: the handle error, or no gradient for the reduction
        assert gradient is None or not np.allclose(gradient, oracle_gradient(reduce_op))
        return
    with context:
        gradient = step()
    np.testing.assert_allclose(gradient.numpy(), oracle_gradient(reduce_op), rtol=1e-6)


class _no_scope:
    def __enter__(self):
        return None

    def __exit__(self, *exc_info):
        return False


@pytest.mark.parametrize("mode", sorted(STEPS))
def test_each_input_gets_its_gradient_on_its_device(strategy, configuration, mode):
    """The gradient with respect to replica r's input of the all-reduce is
    computed on CPU:r (eagerly the tensor's device, traced its op's), with
    the transpose's value (all cotangents summed)."""
    traced_devices, input_devices = [], []

    def gradients():
        inputs = per_replica_x(strategy)
        with tf.GradientTape() as tape:
            tape.watch(inputs.values)

            def share(x):
                context = tf.distribute.get_replica_context()
                y = context.all_reduce("SUM", x)
                return tf.reduce_sum(y * (tf.cast(context.replica_id_in_sync_group,
                                                  tf.float32) + 1.0))
            loss = strategy.reduce("SUM", strategy.run(share, args=(inputs,)), axis=None)
        found = tape.gradient(loss, list(inputs.values))
        input_devices[:] = [x.device for x in inputs.values]
        if mode == "tf_function" and None not in found:
            traced_devices.extend(g.op.device for g in found)
        return found

    with strategy.scope():
        if configuration not in PATCHED_CONFIGURATIONS:
            try:
                found = STEPS[mode](gradients)()
            except (LookupError, RuntimeError, tf.errors.InvalidArgumentError):
                return  # stock: the reduction has no gradient eagerly
            assert found == [None] * REPLICAS  # stock: no replica recorded
            return
        found = STEPS[mode](gradients)()
    assert [short(d) for d in input_devices] == [f"CPU:{r}" for r in range(REPLICAS)]
    placed_on = traced_devices if mode == "tf_function" else [g.device for g in found]
    assert [short(d) for d in placed_on] == [short(d) for d in input_devices]
    total = sum(r + 1.0 for r in range(REPLICAS))
    for g in found:
        np.testing.assert_array_equal(g.numpy(), [total, total])


def short(device):
    return device[device.index("CPU"):]


def test_a_tape_inside_the_replica_keeps_tensorflows_all_reduce(strategy, configuration):
    """With a tape opened inside the replica function, TensorFlow's own
    all_reduce (its gradient an all-reduce in the replicas) runs: the
    tutorial's gradient, on stock and with tfdtape alike."""
    with strategy.scope():
        v = tf.Variable(V0)
    inputs = per_replica_x(strategy)

    def replica_step(x):
        with tf.GradientTape() as tape:
            loss = replica_loss(x, v, "SUM")
        return tape.gradient(loss, v)

    with strategy.scope():
        per_replica = strategy.run(replica_step, args=(inputs,))
    local = strategy.experimental_local_results(per_replica)
    # Replica r's tape sees its own input x_r * v, whose cotangent is the
    # all-reduced sum of every replica's: 2 y (sum_s x_s) x_r, so that the
    # replicas' gradients add up to the total derivative.
    xs = sum(replica_x(r) for r in range(REPLICAS))
    for r, g in enumerate(local):
        np.testing.assert_allclose(
            g.numpy(), oracle_gradient("SUM") * replica_x(r) / xs, rtol=1e-6)


@pytest.mark.skipif(not is_keras3(tf.keras), reason="Keras 3's synchronized "
                    "BatchNormalization (tf_keras's is a separate layer)")
@pytest.mark.parametrize("mode", sorted(STEPS))
def test_synchronized_batch_norm_trains_like_one_device_on_the_global_batch(
        strategy, configuration, mode):
    """Three SGD steps of Dense -> BatchNormalization(synchronized=True) ->
    Dense, the tape around the run and the apply in cross-replica context,
    give the weights of one device trained on the global batch."""
    features = np.linspace(-1.0, 1.0, 8 * 3, dtype=np.float32).reshape(8, 3)
    labels = np.linspace(0.5, -0.5, 8, dtype=np.float32).reshape(8, 1)

    def build(synchronized):
        model = tf.keras.Sequential([
            tf.keras.Input((3,)),
            tf.keras.layers.Dense(4, kernel_initializer="glorot_uniform"),
            tf.keras.layers.BatchNormalization(synchronized=synchronized),
            tf.keras.layers.Dense(1)])
        for weight in model.weights:
            weight.assign(tf.random.stateless_normal(weight.shape, seed=(1, 2)) * 0.5
                          if weight.trainable else weight)
        return model, tf.keras.optimizers.SGD(0.1)

    reference, reference_optimizer = build(False)
    for _ in range(3):
        with tf.GradientTape() as tape:
            error = reference(features, training=True) - labels
            loss = tf.reduce_mean(error * error)
        gradients = tape.gradient(loss, reference.trainable_variables)
        reference_optimizer.apply_gradients(zip(gradients, reference.trainable_variables))

    with strategy.scope():
        model, optimizer = build(True)
    dataset = tf.data.Dataset.from_tensor_slices((features, labels)).batch(8)
    x, y = next(iter(strategy.experimental_distribute_dataset(dataset)))

    def share(x, y):
        error = model(x, training=True) - y
        return tf.nn.compute_average_loss(tf.reduce_sum(error * error, axis=1),
                                          global_batch_size=8)

    def step():
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", strategy.run(share, args=(x, y)), axis=None)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))

    step = STEPS[mode](step)
    with strategy.scope():
        if configuration not in PATCHED_CONFIGURATIONS:
            with pytest.raises((ValueError, LookupError)):
                for _ in range(3):
                    step()
            return
        for _ in range(3):
            step()
    for found, expected in zip(model.weights, reference.weights):
        np.testing.assert_allclose(found.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)


def uneven(r, axis):
    """Replica r's input: r + 1 rows (axis 0) or columns (axis 1) of
    consecutive values."""
    block = np.arange(2.0 * (r + 1), dtype=np.float32).reshape(r + 1, 2) + 10.0 * r
    return block if axis == 0 else block.T.copy()


def gathered_weights(axis):
    """A weight per element of the gathered value (10 rows or columns)."""
    total = sum(r + 1 for r in range(REPLICAS))
    weights = np.arange(2.0 * total, dtype=np.float32).reshape(total, 2) + 1.0
    return weights if axis == 0 else weights.T.copy()


def slices_of(weights, axis):
    """Replica r's slice of `weights` along `axis`: what its input's
    gradient must be, times the number of replicas that weigh it."""
    offsets = np.cumsum([0] + [r + 1 for r in range(REPLICAS)])
    return [np.take(weights, range(offsets[r], offsets[r + 1]), axis=axis)
            for r in range(REPLICAS)]


GATHERS = {
    # Every replica all-gathers and weighs the result: each input's gradient
    # is its slice of the weights, from each of the N replicas.
    "all_gather": lambda strategy, inputs, weights, axis: strategy.reduce(
        "SUM", strategy.run(lambda x: tf.reduce_sum(
            tf.distribute.get_replica_context().all_gather(x, axis=axis) * weights),
            args=(inputs,)), axis=None),
    # strategy.gather in cross-replica context: its slice, once.
    "strategy_gather": lambda strategy, inputs, weights, axis: tf.reduce_sum(
        strategy.gather(inputs, axis=axis) * weights),
}


@pytest.mark.parametrize("gather", sorted(GATHERS))
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("mode", sorted(STEPS))
@pytest.mark.parametrize("scope", ["in_scope", "no_scope"])
def test_gathers_hand_each_input_its_slice_on_its_device(
        strategy, configuration, gather, axis, mode, scope):
    """Inputs of uneven sizes along `axis`; the gradient of each is its
    slice of the cotangent (summed over the replicas for all_gather), on
    its own device. Stock: LookupError (CollectiveGatherV2 has no gradient),
    None where the tape recorded no replica, or for strategy.gather where
    the strategy gathers by concatenating on one device (TensorFlow 2.12's
    default for CPUs) the same gradient."""
    weights = gathered_weights(axis)
    replicas_weighing = REPLICAS if gather == "all_gather" else 1
    expected = [block * replicas_weighing for block in slices_of(weights, axis)]
    traced_devices, input_devices = [], []

    def gradients():
        inputs = placed(strategy, lambda r: uneven(r, axis))
        with tf.GradientTape() as tape:
            tape.watch(inputs.values)
            loss = GATHERS[gather](strategy, inputs, weights, axis)
        found = tape.gradient(loss, list(inputs.values))
        input_devices[:] = [x.device for x in inputs.values]
        if mode == "tf_function" and None not in found:
            traced_devices.extend(g.op.device for g in found)
        return found

    context = strategy.scope() if scope == "in_scope" else _no_scope()
    with context:
        if configuration not in PATCHED_CONFIGURATIONS:
            try:
                found = STEPS[mode](gradients)()
            except Exception as error:  # LookupError; traced, StagingError around it
                assert "LookupError" in f"{type(error).__name__}: {error}"
                assert "CollectiveGatherV2" in str(error)
                return
            if gather == "all_gather" or found == [None] * REPLICAS:
                assert found == [None] * REPLICAS
                return
            for g, block in zip(found, expected):
                np.testing.assert_array_equal(g.numpy(), block)
            return
        found = STEPS[mode](gradients)()
    for g, block in zip(found, expected):
        np.testing.assert_array_equal(g.numpy(), block)
    placed_on = traced_devices if mode == "tf_function" else [g.device for g in found]
    assert [short(d) for d in placed_on] == [short(d) for d in input_devices]
    assert [short(d) for d in input_devices] == [f"CPU:{r}" for r in range(REPLICAS)]


MERGE_FUNCTIONS = {
    "batch_reduce_to": lambda strategy, x: strategy.extended.batch_reduce_to(
        "SUM", [(x, x)])[0],
    "reduce_to": lambda strategy, x: strategy.extended.reduce_to("SUM", x, x),
}


@pytest.mark.parametrize("merge_fn", sorted(MERGE_FUNCTIONS))
@pytest.mark.parametrize("mode", sorted(STEPS))
def test_a_merge_call_of_the_programs_own_is_differentiated(
        strategy, configuration, merge_fn, mode):
    """A merge_call whose function all-reduces (eagerly the collectives
    launch from a thread pool no tape records: the gradient was silently
    None): loss = 4 replicas * (4 * 3v), d/dv = 48. Stock: the handle
    error."""
    with strategy.scope():
        v = tf.Variable(2.0)

    def replica():
        return tf.distribute.get_replica_context().merge_call(
            MERGE_FUNCTIONS[merge_fn], args=(v * 3.0,))

    def step():
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", strategy.run(replica), axis=None)
        return tape.gradient(loss, v)

    with strategy.scope():
        if configuration not in PATCHED_CONFIGURATIONS:
            with pytest.raises(ValueError, match="handle"):
                STEPS[mode](step)()
            return
        assert float(STEPS[mode](step)()) == 48.0


@pytest.mark.parametrize("mode", sorted(STEPS))
def test_an_all_reduce_under_a_tape_inside_the_replica_too_says_where_the_tape_goes(
        strategy, configuration, mode):
    """With a tape opened inside the replica function as well, the
    all-reduce keeps TensorFlow's gradient, which needs the replica
    context: the tape around the run raises where that gradient runs,
    saying why (TensorFlow: "Mismatching tf.distribute.Strategy objects";
    stock: None, its tape recorded no replica)."""
    inputs = placed(strategy, lambda r: np.full((2,), float(r), np.float32))

    def gradients():
        with tf.GradientTape() as tape:
            tape.watch(inputs.values)

            def share(x):
                with tf.GradientTape() as inner:
                    inner.watch(x)
                    y = tf.distribute.get_replica_context().all_reduce("SUM", x)
                return tf.reduce_sum(y)
            loss = strategy.reduce("SUM", strategy.run(share, args=(inputs,)), axis=None)
        return tape.gradient(loss, list(inputs.values))

    if configuration not in PATCHED_CONFIGURATIONS:
        assert STEPS[mode](gradients)() == [None] * REPLICAS
        return
    with pytest.raises(RuntimeError, match="tfdtape: cannot run a collective "
                       "outside the replica it belongs to") as raised:
        STEPS[mode](gradients)()
    assert "while a tape inside the replica function records too" in str(raised.value)


# Regressions found by the review of the change.

@pytest.mark.parametrize("mode", sorted(STEPS))
def test_an_all_reduce_after_an_inner_tape_closed_is_differentiated(
        strategy, configuration, mode):
    """An inner tape around a merge point closes before the all-reduce the
    tape around the run differentiates. The replica threads take turns at
    merge points: one replica must not see another's still-open inner tape
    (it raised `Need to be inside call_for_each_replica()`)."""
    with strategy.scope():
        v = tf.Variable(V0)
    inputs = per_replica_x(strategy)

    def share(x):
        with tf.GradientTape() as inner:
            inner.watch(x)
            count = tf.stop_gradient(tf.distribute.get_replica_context().all_reduce(
                "SUM", tf.reduce_sum(x)))
            square = tf.reduce_sum(x * x)
        inner_gradient = inner.gradient(square, x)
        return (replica_loss(x, v, "SUM") + 0.0 * count +
                0.0 * tf.reduce_sum(inner_gradient))

    def step():
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", strategy.run(share, args=(inputs,)), axis=None)
        return tape.gradient(loss, v)

    with strategy.scope():
        if configuration not in PATCHED_CONFIGURATIONS:
            with pytest.raises(ValueError, match="handle"):
                STEPS[mode](step)()
            return
        gradient = STEPS[mode](step)()
    np.testing.assert_allclose(gradient.numpy(), oracle_gradient("SUM"), rtol=1e-6)


def test_a_forward_accumulator_inside_the_replica_keeps_tensorflows_all_reduce(
        strategy, configuration):
    """Forward-mode derivatives of an all-reduce need TensorFlow's path
    inside the replica: the JVP is that of stock TensorFlow (it was None
    with tfdtape). Each replica's JVP of sum(all_reduce(2x)) along ones is
    2 * N * size(x); the loss sums N of them."""
    inputs = per_replica_x(strategy)

    def share(x):
        with tf.autodiff.ForwardAccumulator(x, tf.ones_like(x)) as accumulator:
            y = tf.distribute.get_replica_context().all_reduce("SUM", x * 2.0)
        return tf.reduce_sum(accumulator.jvp(y))

    with strategy.scope():
        with tf.GradientTape():
            loss = strategy.reduce("SUM", strategy.run(share, args=(inputs,)), axis=None)
    assert float(loss) == REPLICAS * 2.0 * REPLICAS * V0.size


@pytest.mark.parametrize("mode", sorted(STEPS))
@pytest.mark.parametrize("scope", ["in_scope", "no_scope"])
def test_a_collective_recomputed_in_the_backward_pass_is_refused(
        strategy, configuration, mode, scope):
    """tf.recompute_grad recomputes its function in the backward pass of a
    tape around the run, outside the replicas, where the all-reduce would
    reduce nothing (the gradient came out wrong, silently; in the scope
    there was no replica context, which Keras's synchronized
    BatchNormalization takes for local statistics): tfdtape's error, the
    recomputation seeing the default replica context either way. Stock:
    None (its tape recorded no replica), or in the scope the handle
    error."""
    with strategy.scope():
        v = tf.Variable(V0)
    inputs = per_replica_x(strategy)

    @tf.recompute_grad
    def centred(y):
        mean = tf.distribute.get_replica_context().all_reduce("MEAN", y)
        return (y - mean) ** 2

    def step():
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", strategy.run(
                lambda x: tf.reduce_sum(centred(x * v) * x), args=(inputs,)), axis=None)
        return tape.gradient(loss, v)

    context = strategy.scope() if scope == "in_scope" else _no_scope()
    with context:
        if configuration not in PATCHED_CONFIGURATIONS:
            if scope == "in_scope":
                with pytest.raises(ValueError, match="handle"):
                    STEPS[mode](step)()
            else:
                assert STEPS[mode](step)() is None
            return
        with pytest.raises(ValueError, match="cannot run a collective in the backward "
                           "pass of a tape around strategy.run") as raised:
            STEPS[mode](step)()
    assert "tf.distribute.ReplicaContext.all_reduce" in str(raised.value)


@pytest.mark.parametrize("reduce_op", ["SUM", "MEAN"])
@pytest.mark.parametrize("mode", sorted(STEPS))
def test_batch_reduce_to_of_the_runs_values_in_cross_replica_context(
        strategy, configuration, reduce_op, mode):
    """strategy.extended.batch_reduce_to of what strategy.run returned,
    under the tape, outside any merge_call (eagerly its collectives launch
    from a thread pool: the gradient was silently None). loss = sum(r_0 *
    S), r = the reduction of x_r * v: d/dv = S * S (/N for MEAN)."""
    with strategy.scope():
        v = tf.Variable(V0)
    inputs = per_replica_x(strategy)
    xs = sum(replica_x(r) for r in range(REPLICAS))

    def step():
        with tf.GradientTape() as tape:
            products = strategy.run(lambda x: x * v, args=(inputs,))
            reduced = strategy.extended.batch_reduce_to(
                reduce_op, [(products, products)])[0]
            loss = tf.reduce_sum(strategy.experimental_local_results(reduced)[0] * xs)
        return tape.gradient(loss, v)

    with strategy.scope():
        if configuration not in PATCHED_CONFIGURATIONS:
            with pytest.raises(ValueError, match="handle"):
                STEPS[mode](step)()
            return
        gradient = STEPS[mode](step)()
    scale = 1.0 / REPLICAS if reduce_op == "MEAN" else 1.0
    np.testing.assert_allclose(gradient.numpy(), xs * xs * scale, rtol=1e-6)


@pytest.mark.parametrize("mode", sorted(STEPS))
def test_an_all_reduce_of_indexed_slices_is_refused_where_differentiated(
        strategy, configuration, mode):
    """Not differentiable in TensorFlow either (eagerly the gradient was
    silently None): the tape raises tfdtape's error when the gradient
    needs it, and a loss that uses only the forward value of the reduced
    rows elsewhere still differentiates (d/dv sum(x_r * v) summed = S).
    Stock: the handle error."""
    with strategy.scope():
        v = tf.Variable(V0)
    inputs = per_replica_x(strategy)

    def share(x, through_reduction):
        rows = tf.IndexedSlices(tf.reshape(x * v, (1, 2)), tf.constant([0]),
                                tf.constant([2, 2]))
        reduced = tf.distribute.get_replica_context().all_reduce("SUM", rows)
        dense = tf.convert_to_tensor(reduced)
        if through_reduction:
            return tf.reduce_sum(dense * dense)
        return tf.reduce_sum(x * v) + 0.0 * tf.reduce_sum(tf.stop_gradient(dense))

    def step(through_reduction):
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", strategy.run(
                share, args=(inputs, through_reduction)), axis=None)
        return tape.gradient(loss, v)

    with strategy.scope():
        if configuration not in PATCHED_CONFIGURATIONS:
            with pytest.raises(ValueError, match="handle"):
                STEPS[mode](lambda: step(False))()
            return
        np.testing.assert_allclose(STEPS[mode](lambda: step(False))().numpy(),
                                   sum(replica_x(r) for r in range(REPLICAS)))
        with pytest.raises(ValueError, match="cannot differentiate an all-reduce "
                           "of IndexedSlices"):
            STEPS[mode](lambda: step(True))()


# Regressions found by the generated programs' collective dimension.

def test_an_eager_tape_around_a_tf_function_with_collectives_says_where_the_tape_goes(
        strategy, configuration):
    """An eager tape records the tf.function as one call, and TensorFlow
    builds its backward with the all-reduce's own gradient, outside the
    replica: tfdtape's RuntimeError says so (TensorFlow's: "Need to be
    inside `call_for_each_replica()`"). Stock: the handle error first."""
    with strategy.scope():
        v = tf.Variable(V0)
    inputs = per_replica_x(strategy)

    @tf.function
    def loss_of_the_replicas():
        return strategy.reduce("SUM", strategy.run(
            replica_loss, args=(inputs, v, "SUM")), axis=None)

    with strategy.scope(), tf.GradientTape() as tape:
        if configuration not in PATCHED_CONFIGURATIONS:
            tape.watch(inputs.values)  # stock refuses to watch v itself here
            with pytest.raises(RuntimeError, match="Need to be inside"):
                loss_of_the_replicas()
            return
        tape.watch(v)
        with pytest.raises(RuntimeError, match="tfdtape: cannot run a collective "
                           "outside the replica it belongs to") as raised:
            loss_of_the_replicas()
    assert "an eager tape around a tf.function" in str(raised.value)


@pytest.mark.parametrize("collective", ["all_reduce", "all_gather"])
def test_a_tape_around_a_one_device_run_with_collectives_gets_their_gradient(
        configuration, collective):
    """OneDeviceStrategy runs its replica in the calling thread: the tape
    around it records TensorFlow's collective, whose gradient then runs
    outside the replica (TensorFlow: "Mismatching tf.distribute.Strategy
    objects"). Of one replica, the all-reduce and the gather hand the value
    back: y = x v, loss = sum(y² x), d/dv = 2 y x² = [2, -4]."""
    strategy = tf.distribute.OneDeviceStrategy(DEVICES[0])
    v = tf.Variable(V0)

    def share(x):
        context = tf.distribute.get_replica_context()
        y = (context.all_reduce("SUM", x * v) if collective == "all_reduce"
             else context.all_gather(x * v, axis=0))
        return tf.reduce_sum(y * y * x)

    with tf.GradientTape() as tape:
        loss = strategy.run(share, args=(tf.constant(replica_x(0)),))
    if configuration not in PATCHED_CONFIGURATIONS:
        with pytest.raises(RuntimeError, match="Mismatching tf.distribute.Strategy"):
            tape.gradient(loss, v)
        return
    np.testing.assert_array_equal(tape.gradient(loss, v).numpy(), [2.0, -4.0])


def gathers_with_collectives(strategy):
    """Whether this TensorFlow's all_gather under `strategy` builds
    collective ops in a graph (2.12's MirroredStrategy concatenates)."""
    @tf.function
    def gather():
        return strategy.run(lambda: tf.distribute.get_replica_context().all_gather(
            tf.ones([1]), axis=0))

    graph = gather.get_concrete_function().graph
    return any(op.type.startswith("Collective") for op in graph.get_operations())


def test_a_gather_inside_a_tf_cond_branch_is_refused_where_it_runs(
        strategy, configuration):
    """TensorFlow differentiates a tf.cond branch from its graph, where the
    gather's CollectiveGatherV2 has no gradient: tfdtape refuses when the
    branch is built (TensorFlow raised its LookupError there). Where the
    gather is a concatenation (2.12) the branch's gradient is exact:
    sum over replicas of sum((concat_s x_s * v) ** 2). Stock: the handle
    error at the gradient."""
    with strategy.scope():
        v = tf.Variable(V0)
    inputs = per_replica_x(strategy)

    def share(x):
        gathered = tf.distribute.get_replica_context().all_gather(x * v, axis=0)
        return tf.reduce_sum(gathered * gathered)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.cond(tf.constant(True), lambda: strategy.reduce(
                "SUM", strategy.run(share, args=(inputs,)), axis=None), lambda: 0.0)
        return tape.gradient(loss, v)

    with strategy.scope():
        if configuration not in PATCHED_CONFIGURATIONS:
            with pytest.raises(ValueError, match="handle is not available"):
                step()
            return
        if not gathers_with_collectives(strategy):
            squares = sum(np.square(replica_x(r)) for r in range(REPLICAS))
            np.testing.assert_allclose(step().numpy(), 2 * REPLICAS * squares * V0)
            return
        with pytest.raises(ValueError, match="tfdtape: cannot differentiate a "
                           "collective inside a tf.cond branch or loop body") as raised:
            step()
    assert "CollectiveGatherV2 has no gradient" in str(raised.value)
