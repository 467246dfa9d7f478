"""Where a tape around `strategy.run` computes: each replica's backward pass
on that replica's device, and the total through the strategy's reduction.

The reference is TensorFlow's tutorial step (tape inside `strategy.run`),
whose backward runs in the replicas. Stock TensorFlow cannot run the
spanning step: its tape records none of the replicas (None gradients) or
raises the handle error.
"""

import collections
import re

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import context

from conftest import DEVICES
from keras_models import is_keras3
from keras_models import tf_variable
from tfdtape import component_totals
from tfdtape.testing import PATCHED_CONFIGURATIONS

pytestmark = pytest.mark.per_release

REPLICAS = len(DEVICES)


def replica_inputs(strategy):
    return strategy.experimental_distribute_values_from_function(
        lambda context: tf.fill((2, 3), float(context.replica_id_in_sync_group + 1)))


def dense_model(strategy):
    """Two Keras Dense layers built in the scope, fixed weights."""
    with strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.Input((3,)),
            tf.keras.layers.Dense(4, activation="tanh", kernel_initializer="ones"),
            tf.keras.layers.Dense(1, kernel_initializer="ones")])
    return model, [tf_variable(w) for w in model.trainable_variables]


REDUCTIONS = {
    "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce,
    "reduction_to_one_device": tf.distribute.ReductionToOneDevice,
}
_strategies = {}


def strategy_reducing_by(name, default):
    """MirroredStrategy over DEVICES with the named cross-device ops, one per
    name for the process ("default": the conftest strategy)."""
    if name == "default":
        return default
    if name not in _strategies:
        _strategies[name] = tf.distribute.MirroredStrategy(
            DEVICES, cross_device_ops=REDUCTIONS[name]())
    return _strategies[name]


def reduces_on_first_device_by_default(strategy):
    """Whether TensorFlow's MirroredStrategy picked ReductionToOneDevice for
    float values (its default for CPUs on TensorFlow 2.12)."""
    return isinstance(strategy.extended._get_cross_device_ops(tf.constant(0.0)),
                      tf.distribute.ReductionToOneDevice)


def short(device):
    return device.rsplit("/", 1)[-1] if device else ""


@pytest.mark.parametrize("kind", ["raw", "keras"])
def test_each_replicas_gradients_are_computed_on_its_device(
        strategy, configuration, kind):
    """Eagerly: the gradient with respect to replica r's component comes
    back from CPU:r, as in the tutorial step."""
    if kind == "raw":
        with strategy.scope():
            v = tf.Variable([[1.0], [2.0], [3.0]])
        variables = [v]

        def loss_of(x):
            return tf.reduce_sum(tf.matmul(x, v) ** 2)
    else:
        model, variables = dense_model(strategy)

        def loss_of(x):
            return tf.reduce_sum(model(x) ** 2)

    inputs = replica_inputs(strategy)
    components = [c for variable in variables for c in variable.values]
    with strategy.scope():
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", strategy.run(loss_of, args=(inputs,)),
                                   axis=None)
        gradients = tape.gradient(loss, components)
    if configuration not in PATCHED_CONFIGURATIONS:
        assert gradients == [None] * len(components)  # no replica recorded
        return
    assert [short(g.device) for g in gradients] == [
        short(c.device) for c in components]
    # The tutorial step: the same devices, and the same values.

    def tutorial(x):
        with tf.GradientTape() as replica_tape:
            replica_loss = loss_of(x)
        return replica_tape.gradient(replica_loss, variables)

    per_replica = strategy.run(tutorial, args=(inputs,))
    for index, variable in enumerate(variables):
        local = strategy.experimental_local_results(per_replica[index])
        assert [short(g.device) for g in local] == [short(c.device) for c in variable.values]
        for replica, expected in enumerate(local):
            found = gradients[index * REPLICAS + replica]
            np.testing.assert_array_equal(found.numpy(), expected.numpy())


def backward_ops(graph):
    """(name, device) of each op tf.GradientTape's backward pass added."""
    return [(op.name, short(op.device)) for op in graph.get_operations()
            if op.name.startswith("gradient_tape/")]


def replica_of(name):
    """The replica an op's name scope says it belongs to (0 without one)."""
    for part in name.split("/"):
        if part.startswith("replica_") and part[len("replica_"):].isdigit():
            return int(part[len("replica_"):])
    return 0


def test_traced_backward_ops_carry_their_replicas_device(strategy, configuration):
    """In a tf.function: every backward op of replica r's forward ops is
    placed on CPU:r, as the tutorial step's are; only those of the
    cross-replica reduce carry none (their forward ops had none)."""
    model, variables = dense_model(strategy)
    inputs = replica_inputs(strategy)

    @tf.function
    def spanning():
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", strategy.run(
                lambda x: tf.reduce_sum(model(x) ** 2), args=(inputs,)), axis=None)
        return tape.gradient(loss, variables)

    @tf.function
    def tutorial():
        def step(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(x) ** 2)
            return tape.gradient(loss, variables)
        return strategy.run(step, args=(inputs,))

    with strategy.scope():
        if configuration not in PATCHED_CONFIGURATIONS:
            with pytest.raises(ValueError, match="handle is not available"):
                spanning()
            return
        spanning_ops = backward_ops(spanning.get_concrete_function().graph)
        tutorial_ops = backward_ops(tutorial.get_concrete_function().graph)
    placed = [(name, device) for name, device in spanning_ops if device]
    assert all(device == f"device:CPU:{replica_of(name)}" for name, device in placed)
    unplaced = [name for name, device in spanning_ops if not device]
    assert all("replica_" not in name for name in unplaced)
    # As many backward ops on each device as the tutorial step has there.
    assert collections.Counter(d for _, d in placed) == collections.Counter(
        d for _, d in tutorial_ops) == {
        f"device:CPU:{r}": len(tutorial_ops) // REPLICAS for r in range(REPLICAS)}


@pytest.mark.parametrize("reduction", ["default", "hierarchical_copy"])
def test_the_total_is_reduced_by_the_strategy_and_applied_per_device(
        strategy, configuration, reduction, monkeypatch):
    """In a tf.function, with the default all-reduce (as on GPUs: here
    told that summing in place does not pay) or one the program chose
    (HierarchicalCopyAllReduce), the total comes from the strategy's
    batch_reduce_to: a copy on each device, handed to each device's update
    in cross-replica context."""
    monkeypatch.setattr(component_totals, "_sums_in_place", lambda *_: False)
    strategy = strategy_reducing_by(reduction, strategy)
    if reduces_on_first_device_by_default(strategy):
        pytest.skip("this TensorFlow's MirroredStrategy reduces on its first "
                    "device by default, summed in place: "
                    "test_the_returned_total_is_a_tensor_remembered_with_its_copies")
    model, variables = dense_model(strategy)
    inputs = replica_inputs(strategy)
    with strategy.scope():
        optimizer = tf.keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", strategy.run(
                lambda x: tf.reduce_sum(model(x) ** 2), args=(inputs,)), axis=None)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables),
                                  **({} if is_keras3(tf.keras)
                                     else {"skip_gradients_aggregation": True}))

    with strategy.scope():
        if configuration not in PATCHED_CONFIGURATIONS:
            with pytest.raises(ValueError, match="handle is not available"):
                step()
            return
        graph = step.get_concrete_function().graph
    # Each device's update reads the gradient from its own device.
    # Keras 3 subtracts the step from the variable; Keras 2 assigns the new
    # value. Updates of other state (the iteration count, from reads) have
    # no gradient input.
    updates = [(op, {short(t.op.device) for t in _gradient_inputs(op)})
               for op in graph.get_operations()
               if op.type in ("AssignSubVariableOp", "AssignAddVariableOp",
                              "AssignVariableOp") and
               "/update_" in f"/{op.name}" and op.inputs[1].dtype == tf.float32]
    updates = [(op, sources) for op, sources in updates if sources]
    assert len(updates) == REPLICAS * len(variables)
    for op, sources in updates:
        # update_<replica>, made unique per variable: update_<replica>_<k>
        replica = int(op.name.split("update_")[1].split("/")[0].split("_")[0])
        assert sources == {f"device:CPU:{replica}"}, (op.name, sources)
    if reduction == "default":
        assert "CollectiveReduceV2" in {op.type for op in graph.get_operations()}


@pytest.mark.parametrize("configuration", PATCHED_CONFIGURATIONS, indirect=True)
@pytest.mark.parametrize("in_place", [True, False])
def test_on_cpus_the_default_all_reduce_is_replaced_by_a_sum_in_place(
        strategy, configuration, in_place, monkeypatch):
    """With the default all-reduce on this host's CPUs, the totals are summed
    in place (no collective); told otherwise (as on GPUs), all-reduced; the
    total is the same either way."""
    if not in_place:
        monkeypatch.setattr(component_totals, "_sums_in_place", lambda *_: False)
    if reduces_on_first_device_by_default(strategy):
        pytest.skip("this TensorFlow's MirroredStrategy reduces on its first "
                    "device by default: summed in place at any size")
    with strategy.scope():
        v = tf.Variable([1.0, 2.0])

    @tf.function
    def gradient():
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", strategy.run(lambda: tf.reduce_sum(v * v)),
                                   axis=None)
        return tape.gradient(loss, v)

    with strategy.scope():
        total = gradient()
        types = {op.type for op in gradient.get_concrete_function().graph.get_operations()}
    np.testing.assert_array_equal(total.numpy(), [2.0 * REPLICAS, 4.0 * REPLICAS])
    assert ("CollectiveReduceV2" in types) == (not in_place)


def _gradient_inputs(update):
    """The tensors of the value an AssignSubVariableOp subtracts: the
    inputs of the ops producing it, up to the first placed ones."""
    found, pending = [], [update.inputs[1]]
    while pending:
        tensor = pending.pop()
        if tensor.op.device or not tensor.op.inputs:
            found.append(tensor)
        else:
            pending.extend(tensor.op.inputs)
    return [t for t in found if t.dtype != tf.resource]


@pytest.mark.parametrize("reduction", ["default", "hierarchical_copy",
                                       "reduction_to_one_device"])
def test_the_returned_total_is_a_tensor_remembered_with_its_copies(
        strategy, configuration, reduction):
    """Eagerly: a tensor either way; copies per device where the strategy
    all-reduces by a reduction the program chose; the sum in place, nothing
    remembered, where that costs no more: ReductionToOneDevice (it sums on
    its first device by add_n and copies out, as the apply does) and the
    default reduction when every device is a CPU of this host (as here)."""
    strategy = strategy_reducing_by(reduction, strategy)
    with strategy.scope():
        v = tf.Variable([1.0, 2.0])
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", strategy.run(lambda: tf.reduce_sum(v * v)),
                                   axis=None)
        if configuration not in PATCHED_CONFIGURATIONS:
            with pytest.raises(ValueError, match="handle is not available"):
                tape.gradient(loss, v)
            return
        total = tape.gradient(loss, v)
    assert isinstance(total, tf.Tensor)
    np.testing.assert_array_equal(total.numpy(), [2.0 * REPLICAS, 4.0 * REPLICAS])
    if reduction in ("default", "reduction_to_one_device"):
        assert component_totals.per_device([total])[0] is total
        return
    ((swapped, variable),) = component_totals.per_device([(total, v)])
    assert variable is v
    assert isinstance(swapped, tf.distribute.DistributedValues)
    copies = strategy.experimental_local_results(swapped)
    assert [short(c.device) for c in copies] == [short(c.device) for c in v.values]
    assert any(c is total for c in copies)
    for copy in copies:
        np.testing.assert_array_equal(copy.numpy(), total.numpy())
    changed = total * 1.0  # a new tensor: copied as TensorFlow copies it
    assert component_totals.per_device([changed])[0] is changed


def _spanning_square(strategy, v, persistent=False):
    """A tape around the run of target = sum_r (r + 1) * v * v (elementwise)
    and its sum; returns the tape, the target and the sum."""
    tape = tf.GradientTape(persistent=persistent)
    with tape:
        target = strategy.reduce("SUM", strategy.run(lambda: (
            tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group,
                    tf.float32) + 1.0) * v * v), axis=None)
        total = tf.reduce_sum(target)
    return tape, target, total


SCALE = REPLICAS * (REPLICAS + 1) / 2  # sum_r (r + 1)


@pytest.mark.parametrize("configuration", PATCHED_CONFIGURATIONS, indirect=True)
@pytest.mark.parametrize("where", ["second_order", "jacobian_pfor",
                                   "jacobian_while_loop_traced", "cond_branch"])
def test_where_the_total_could_run_again_it_is_summed_in_place(
        strategy, configuration, where):
    """The strategy's reduction has no gradient and must run once per step:
    where the total could be differentiated (an outer tape), vectorized
    (jacobian's pfor), looped or branched over, tfdtape sums the components
    where tape.gradient runs, and the total is right (no hang, no None)."""
    with strategy.scope():
        v = tf.Variable([1.0, 2.0])
    expected_first = 2.0 * SCALE * np.array([1.0, 2.0], np.float32)
    if where == "second_order":
        with strategy.scope():
            with tf.GradientTape() as outer:
                tape, _, total = _spanning_square(strategy, v)
                first = tape.gradient(total, v)
            second = outer.gradient(first, v)
        np.testing.assert_array_equal(first.numpy(), expected_first)
        np.testing.assert_array_equal(second.numpy(), [2.0 * SCALE] * 2)
    elif where in ("jacobian_pfor", "jacobian_while_loop_traced"):
        with strategy.scope():
            tape, target, _ = _spanning_square(strategy, v, persistent=True)
            if where == "jacobian_pfor":
                jacobian = tape.jacobian(target, v)
            else:
                jacobian = tf.function(lambda: tape.jacobian(
                    target, v, experimental_use_pfor=False))()
        np.testing.assert_array_equal(jacobian.numpy(), np.diag(expected_first))
        first = jacobian
    else:
        @tf.function
        def branched(flag):
            tape, _, total = _spanning_square(strategy, v)
            return tf.cond(flag, lambda: tape.gradient(total, v),
                           lambda: tf.zeros([2]))
        with strategy.scope():
            first = branched(tf.constant(True))
        np.testing.assert_array_equal(first.numpy(), expected_first)
    # Summed where it ran: nothing remembered to hand on per device.
    assert component_totals.per_device([first])[0] is first


@pytest.mark.parametrize("configuration", PATCHED_CONFIGURATIONS, indirect=True)
def test_a_remembered_total_is_forgotten_with_the_tensor(strategy, configuration):
    """Eagerly the entry goes when the program drops the gradient (it held
    the total itself once, and 50 steps kept 50 totals per variable); in a
    tf.function the entries live on the traced graph, not in the module."""
    import gc

    strategy = strategy_reducing_by("hierarchical_copy", strategy)
    with strategy.scope():
        v = tf.Variable([1.0, 2.0])
    before = len(component_totals._copies)
    for _ in range(5):
        with strategy.scope():
            with tf.GradientTape() as tape:
                loss = strategy.reduce("SUM", strategy.run(
                    lambda: tf.reduce_sum(v * v)), axis=None)
            total = tape.gradient(loss, v)
        assert len(component_totals._copies) == before + 1
        del total
        gc.collect()
        assert len(component_totals._copies) == before

    @tf.function
    def traced():
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", strategy.run(
                lambda: tf.reduce_sum(v * v)), axis=None)
        total = tape.gradient(loss, v)
        assert isinstance(component_totals.per_device([total])[0],
                          tf.distribute.DistributedValues)
        return total

    with strategy.scope():
        np.testing.assert_array_equal(traced().numpy(),
                                      [2.0 * REPLICAS, 4.0 * REPLICAS])
    assert len(component_totals._copies) == before


@tf.custom_gradient
def _doubled_square(x):
    """x ** 2 whose gradient, its own backward function, is 2 * (2x)."""
    def backward(upstream):
        return upstream * 4.0 * x
    return x * x, backward


@tf.function
def _nested_square(x):
    return x * x


def _recomputed_square(x):
    return tf.recompute_grad(lambda y: y * y)(x)


RECORDED_BACKWARDS = {
    # name: (replica function of x and a variable, d loss / d variable per
    # replica for x = replica + 1 and v = 2: the oracle)
    "custom_gradient": (lambda x, v: tf.reduce_sum(_doubled_square(x * v)),
                        lambda r: 6 * 4.0 * (r + 1) * (r + 1) * 2.0),
    "nested_tf_function": (lambda x, v: tf.reduce_sum(_nested_square(x * v)),
                           lambda r: 6 * 2.0 * (r + 1) * (r + 1) * 2.0),
    "recompute_grad": (lambda x, v: tf.reduce_sum(_recomputed_square(x * v)),
                       lambda r: 6 * 2.0 * (r + 1) * (r + 1) * 2.0),
}


@pytest.mark.parametrize("kind", sorted(RECORDED_BACKWARDS))
def test_recorded_backward_functions_run_on_their_replicas_device(
        strategy, configuration, kind):
    """Eagerly, operations recorded with a backward function of their own
    (tf.custom_gradient, a tf.function called in the replica, tf.recompute_grad):
    the gradient with respect to replica r's component comes from CPU:r,
    with the tutorial step's value."""
    replica_loss, expected = RECORDED_BACKWARDS[kind]
    with strategy.scope():
        v = tf.Variable(2.0)
    inputs = replica_inputs(strategy)
    with strategy.scope():
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", strategy.run(
                replica_loss, args=(inputs, v)), axis=None)
        gradients = tape.gradient(loss, list(v.values))
    if configuration not in PATCHED_CONFIGURATIONS:
        assert gradients == [None] * REPLICAS
        return
    assert [short(g.device) for g in gradients] == [short(c.device) for c in v.values]
    assert [float(g) for g in gradients] == [expected(r) for r in range(REPLICAS)]


@pytest.mark.parametrize("kind", sorted(RECORDED_BACKWARDS))
def test_traced_recorded_backward_functions_carry_their_replicas_device(
        strategy, configuration, kind):
    """In a tf.function: the backward ops of operations recorded with their
    own backward function carry their replica's device, as many on each
    device as the tutorial step places there; the total is the oracle's."""
    replica_loss, expected = RECORDED_BACKWARDS[kind]
    with strategy.scope():
        v = tf.Variable(2.0)
    inputs = replica_inputs(strategy)

    backward = {}  # style: (name, device) of each op its gradient added

    def ops_added(style, gradient):
        graph = tf.compat.v1.get_default_graph()
        before = len(graph.get_operations())
        result = gradient()
        backward[style] = [(op.name, short(op.device))
                           for op in graph.get_operations()[before:]]
        return result

    @tf.function
    def spanning():
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", strategy.run(
                replica_loss, args=(inputs, v)), axis=None)
        return ops_added("spanning", lambda: tape.gradient(loss, v))

    @tf.function
    def tutorial():
        added = []

        def step(x):
            with tf.GradientTape() as tape:
                loss = replica_loss(x, v)
            graph = tf.compat.v1.get_default_graph()
            before = len(graph.get_operations())
            gradient = tape.gradient(loss, v)
            added.extend((op.name, short(op.device))
                         for op in graph.get_operations()[before:])
            return gradient
        result = strategy.run(step, args=(inputs,))
        backward["tutorial"] = added
        return result

    with strategy.scope():
        if configuration not in PATCHED_CONFIGURATIONS:
            with pytest.raises(ValueError, match="handle is not available"):
                spanning()
            return
        total = spanning()
        tutorial.get_concrete_function()
    spanning_ops, tutorial_ops = backward["spanning"], backward["tutorial"]
    assert float(total) == sum(expected(r) for r in range(REPLICAS))
    # The tape's own fills (the first upstream gradient, zeros for outputs
    # that get none) are made where tape.gradient runs, unplaced here as the
    # cross-replica sum is; in the tutorial that is inside the replica.
    spanning_ops = [(name, device) for name, device in spanning_ops
                    if not _is_tape_fill(name)]
    tutorial_ops = [(name, device) for name, device in tutorial_ops
                    if not _is_tape_fill(name)]
    # The sum over the variable's components, in cross-replica context:
    # packed on each device, summed on the first, cut on each.
    totals = [(name, device) for name, device in spanning_ops
              if name.startswith(component_totals.TOTALS_SCOPE + "/")]
    assert [device for name, device in totals if "AddN" in name] == ["device:CPU:0"]
    assert {device for _, device in totals} == {f"device:CPU:{r}" for r in range(REPLICAS)}
    spanning_ops = [op for op in spanning_ops if op not in totals]
    placed = [(name, device) for name, device in spanning_ops if device]
    # Ops a backward function makes are named as it names them (the
    # recomputed forward of tf.recompute_grad: "mul_3" for replica 1), so only
    # a name that says its replica is held to it.
    assert all(device == f"device:CPU:{replica_of(name)}"
               for name, device in placed if replica_of(name)), placed
    assert [name for name, device in spanning_ops if not device] == []
    # As many on each device as the tutorial step puts there (on TensorFlow
    # 2.12 replica 0 makes 3 more: shape constants the others reuse).
    per_device = collections.Counter(d for _, d in placed)
    assert per_device == collections.Counter(d for _, d in tutorial_ops)
    assert set(per_device) == {f"device:CPU:{r}" for r in range(REPLICAS)}


def _is_tape_fill(name):
    """Whether an op is a fill the tape itself makes: ones, zeros, ones_1..."""
    return re.fullmatch(r"(ones|zeros)(_\d+)?", name.rsplit("/", 1)[-1]) is not None


def _stack(strategy, layers):
    """A Keras stack of `layers` Dense layers of 3, built in the scope."""
    with strategy.scope():
        return tf.keras.Sequential(
            [tf.keras.Input((3,))] +
            [tf.keras.layers.Dense(3, activation="tanh") for _ in range(layers)] +
            [tf.keras.layers.Dense(1)])


def _transfers(function):
    """How many tensors the first call of `function` (a tf.function not yet
    called) sends between devices: the `_Send` ops of the graphs TensorFlow
    partitioned it into."""
    runtime = context.context()
    runtime.enable_graph_collection()
    try:
        function()
        collected = runtime.export_run_metadata()
    finally:
        runtime.disable_graph_collection()
    return sum(node.op == "_Send" for graphs in collected.function_graphs
               for partition in graphs.partition_graphs for node in partition.node)


def _one_step_each(strategy, inputs, layers):
    """One traced spanning step and one tutorial step of SGD on two equal
    stacks of `layers`: (the spanning step's transfers, its model, the
    tutorial's model)."""
    model = _stack(strategy, layers)
    tutorial_model = _stack(strategy, layers)
    tutorial_model.set_weights(model.get_weights())
    with strategy.scope():
        optimizer = tf.keras.optimizers.SGD(0.1)
        tutorial_optimizer = tf.keras.optimizers.SGD(0.1)

    @tf.function
    def spanning():
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", strategy.run(
                lambda x: tf.reduce_sum(model(x) ** 2), args=(inputs,)), axis=None)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))

    @tf.function
    def tutorial():
        def step(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tutorial_model(x) ** 2)
            gradients = tape.gradient(loss, tutorial_model.trainable_variables)
            tutorial_optimizer.apply_gradients(
                zip(gradients, tutorial_model.trainable_variables))
        strategy.run(step, args=(inputs,))

    with strategy.scope():
        transfers = _transfers(spanning)
        tutorial()
    return transfers, model, tutorial_model


@pytest.mark.parametrize("configuration", PATCHED_CONFIGURATIONS, indirect=True)
@pytest.mark.parametrize("packed", [True, False])
def test_in_a_graph_totals_cross_devices_once_per_device_not_per_variable(
        strategy, configuration, packed, monkeypatch):
    """On this host's CPUs a traced spanning step's totals go to the first
    device in one pack per device and come back in one: the transfers
    between devices do not grow with the number of variables (a graph pays a
    _Send/_Recv pair per transfer), each device's update reads its own
    copy, and the step trains as the tutorial's does. The control, each
    variable summed alone: two more transfers per variable and device."""
    if not packed:
        monkeypatch.setattr(component_totals, "packed_totals",
                            lambda gradients: [None] * len(gradients))
    inputs = replica_inputs(strategy)
    edges, trained = {}, {}
    for layers in (1, 4):
        edges[layers], model, tutorial_model = _one_step_each(strategy, inputs, layers)
        for weights, expected in zip(model.get_weights(), tutorial_model.get_weights()):
            np.testing.assert_allclose(weights, expected, rtol=1e-5, atol=1e-6)
        trained[layers] = len(model.trainable_variables)
    more_variables = trained[4] - trained[1]
    if packed:
        assert edges[4] == edges[1]
    else:
        assert edges[4] - edges[1] == 2 * (REPLICAS - 1) * more_variables


@pytest.mark.parametrize("configuration", PATCHED_CONFIGURATIONS, indirect=True)
def test_packed_totals_keep_each_dtype_and_sum_an_unknown_shape_alone(
        strategy, configuration):
    """Variables of two dtypes pack apart; a variable of unknown shape is
    summed on its own; every total is the sum over the replicas."""
    with strategy.scope():
        single = tf.Variable([1.0, 2.0])
        double = tf.Variable(np.array([3.0], np.float64))
        unknown = tf.Variable([[1.0, 1.0]], shape=tf.TensorShape(None))
        matrix = tf.Variable([[2.0]])

    def replica_loss():
        weight = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group + 1,
                         tf.float32)
        return weight * (tf.reduce_sum(single * single) +
                         tf.cast(tf.reduce_sum(double * double), tf.float32) +
                         3.0 * tf.reduce_sum(unknown) + tf.reduce_sum(matrix ** 3))

    @tf.function
    def gradients():
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", strategy.run(replica_loss), axis=None)
        return tape.gradient(loss, [single, double, unknown, matrix])

    with strategy.scope():
        found = gradients()
        graph = gradients.get_concrete_function().graph
    weights = REPLICAS * (REPLICAS + 1) / 2
    np.testing.assert_array_equal(found[0].numpy(), [2.0 * weights, 4.0 * weights])
    assert found[1].dtype == tf.float64
    np.testing.assert_array_equal(found[1].numpy(), [6.0 * weights])
    np.testing.assert_array_equal(found[2].numpy(), [[3.0 * weights] * 2])
    np.testing.assert_array_equal(found[3].numpy(), [[12.0 * weights]])
    packed_sums = [op for op in graph.get_operations() if op.type == "AddN" and
                   op.name.startswith(component_totals.TOTALS_SCOPE + "/")]
    # float32: `single` and `matrix` (3 elements); float64: `double`.
    assert sorted((op.outputs[0].dtype.name, op.outputs[0].shape.as_list())
                  for op in packed_sums) == [("float32", [3]), ("float64", [1])]
    assert {short(op.device) for op in packed_sums} == {"device:CPU:0"}
