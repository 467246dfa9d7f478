"""`tfdtape.horovod`: Horovod's API on TensorFlow's collectives.

In this process (a job of one: no TF_CONFIG): the single-process semantics,
bad input and what is refused. On 2 and 3 processes on loopback started by
`tfdtape launch` (cluster tests): every operation against its closed form,
training with DistributedGradientTape eagerly and in tf.function against one
device on the global batch, ranks bitwise equal, and a rank that fails ends
the job.
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import fault_points
import restart_jobs
import tfdtape.horovod as hvd
from keras_models import is_keras3
from tfdtape.horovod import fusion

pytestmark = pytest.mark.per_release

SCRIPTS = pathlib.Path(__file__).resolve().parent / "horovod_scripts"


@pytest.fixture
def alone(monkeypatch):
    """hvd initialized as a job of one process (no TF_CONFIG, no Slurm)."""
    for name in ("TF_CONFIG", "SLURM_NTASKS", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    hvd.init()
    yield
    hvd.shutdown()


def test_before_init_every_question_is_refused_clearly():
    hvd.shutdown()
    assert not hvd.is_initialized()
    for ask in (hvd.rank, hvd.size, lambda: hvd.allreduce(tf.constant(1.0))):
        with pytest.raises(ValueError, match=r"^tfdtape: tfdtape.horovod has not been "
                                             r"initialized .*call hvd.init\(\) first"):
            ask()


def test_a_job_of_one_process(alone):
    assert hvd.is_initialized()
    assert [hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(),
            hvd.cross_rank(), hvd.cross_size()] == [0, 1, 0, 1, 0, 1]
    value = tf.constant([1.0, 3.0])
    for op in (hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product):
        np.testing.assert_array_equal(hvd.allreduce(value, op=op).numpy(), [1.0, 3.0])
    np.testing.assert_array_equal(
        hvd.allreduce(value, prescale_factor=2.0, postscale_factor=3.0).numpy(), [6.0, 18.0])
    np.testing.assert_array_equal(hvd.allgather(tf.ones((2, 1))).numpy(), [[1.0], [1.0]])
    np.testing.assert_array_equal(hvd.broadcast(value, 0).numpy(), [1.0, 3.0])
    assert hvd.broadcast_object({"a": 1}) == {"a": 1}
    assert hvd.allgather_object("x") == ["x"]
    w = tf.Variable([2.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * w)
    distributed = hvd.DistributedGradientTape(tape)
    assert isinstance(distributed, tf.GradientTape)
    assert type(distributed).__name__ == "GradientTape"
    np.testing.assert_array_equal(distributed.gradient(loss, [w])[0].numpy(), [4.0])


@pytest.mark.parametrize("call, message", [
    (lambda: hvd.allreduce(tf.constant(1.0), op=hvd.Sum, average=True),
     "both op and average were given"),
    (lambda: hvd.allreduce(tf.constant(1.0), op=17), "an unknown reduction op"),
    (lambda: hvd.allgather(tf.constant(1.0)), "a scalar was to be gathered"),
    (lambda: hvd.broadcast(tf.constant(1.0), 1), "a broadcast from a rank the job does not have"),
    (lambda: hvd.allreduce(tf.constant(["a"]), op=hvd.Sum),
     "a tensor of a dtype no collective carries"),
    (lambda: hvd.alltoall(tf.constant(1.0)), "a scalar was to be exchanged"),
    (lambda: hvd.reducescatter(tf.constant(1.0)), "a scalar was to be reduce-scattered"),
    (lambda: hvd.DistributedGradientTape(tf.GradientTape(), op=hvd.Sum,
                                         gradient_predivide_factor=2.0),
     "gradient_predivide_factor was given with an op other than Average"),
])
def test_bad_input_is_one_clear_error(alone, call, message):
    with pytest.raises(ValueError) as raised:
        call()
    assert str(raised.value).startswith(f"tfdtape: {message} (tfdtape.horovod")
    assert f"TensorFlow {tf.__version__}" in str(raised.value)


def test_a_tape_must_be_a_tape(alone):
    with pytest.raises(TypeError, match="expected a tf.GradientTape, found list"):
        hvd.DistributedGradientTape([])


@pytest.mark.parametrize("use", [
    lambda: hvd.allreduce(tf.constant(1.0), op=hvd.Adasum),
    lambda: hvd.join(),
    lambda: hvd.start_timeline("/tmp/t.json"),
    lambda: hvd.init(comm=[0, 1]),
])
def test_what_horovod_has_and_this_does_not_is_refused_naming_the_alternative(alone, use):
    with pytest.raises(NotImplementedError) as raised:
        use()
    text = str(raised.value)
    assert text.startswith("tfdtape: ") and "in TensorFlow" in text
    assert text.rstrip(".").rsplit(". ", 1)[-1]  # a remedy follows


def test_gradients_through_min_max_product_are_refused(alone):
    x = tf.Variable([1.0])
    with tf.GradientTape() as tape:
        y = hvd.allreduce(x, op=hvd.Max)
    with pytest.raises(LookupError, match="a gradient through an all-reduce with no "
                                          "derivative"):
        tape.gradient(y, x)


def test_fusion_packs_one_dtype_up_to_the_threshold(monkeypatch):
    tensors = [tf.zeros((4,)), tf.zeros((2,), tf.float64), tf.zeros((4,)), tf.zeros((8,))]
    assert fusion.packs(tensors) == [[0, 2, 3], [1]]
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "32")  # 8 float32
    assert fusion.packs(tensors) == [[0, 2], [1], [3]]
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "0")
    assert fusion.packs(tensors) == [[0], [1], [2], [3]]
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "lots")
    with pytest.raises(ValueError, match="HOROVOD_FUSION_THRESHOLD is not a size"):
        fusion.packs(tensors)


def launch(processes, script, *arguments, timeout=300, env=None):
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **(env or {}))
    environment.pop("TF_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "tfdtape", "launch", "-np", str(processes), "--grace", "5",
         sys.executable, str(SCRIPTS / script), *arguments],
        capture_output=True, text=True, env=environment, timeout=timeout)


def outputs(completed):
    """rank -> the JSON object it printed."""
    found = {}
    for line in completed.stdout.splitlines():
        prefix, _, text = line.partition("<stdout>:")
        found[int(prefix.strip("[]"))] = json.loads(text)
    return found


def one_device_training(size, steps=3):
    """The ops_check training on one device on the global batch (NumPy)."""
    features = np.arange(6 * size * 3, dtype=np.float32).reshape(6 * size, 3) / 10.0
    labels = features @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 1.0
    weights, bias = np.zeros((3, 1), np.float32), np.zeros(1, np.float32)
    for _ in range(steps):
        error = features @ weights + bias - labels
        weights = weights - 0.1 * (2.0 * features.T @ error / len(features))
        bias = bias - 0.1 * (2.0 * error.mean(axis=0))
    return weights.ravel(), bias


@pytest.mark.cluster
@pytest.mark.parametrize("processes", [2, pytest.param(3, marks=pytest.mark.per_release(False))])
def test_every_operation_matches_its_closed_form(processes):
    completed = launch(processes, "ops_check.py")
    assert completed.returncode == 0, completed.stderr[-3000:]
    found = outputs(completed)
    assert sorted(found) == list(range(processes))
    n = processes
    ranks = np.arange(1, n + 1, dtype=np.float64)
    for rank, result in found.items():
        assert result["rank"] == rank and result["size"] == n
        assert result["local"] == [rank, n]
        assert result["average"] == [ranks.mean(), 2 * ranks.mean()]
        assert result["sum"] == [ranks.sum(), 2 * ranks.sum()]
        assert result["min"] == [1.0, 2.0] and result["max"] == [n, 2.0 * n]
        assert result["product"] == [np.prod(ranks), np.prod(2 * ranks)]
        assert result["scaled"] == [ranks.sum() / 2, ranks.sum()]
        assert result["int_sum"] == [n * (n - 1) // 2, n]
        assert result["int_scaled"] == [int(n * (n + 1) / 2 * 0.5), int(3 * n * 0.5)]
        # Horovod's integer average: the sum divided, truncated toward zero.
        assert result["int_average"] == [int(n * (n + 1) / 2 / n), int(-3 * n * (n - 1) / 2 / n)]
        assert result["alltoall"] == [[10.0 * r + rank for r in range(n) for _ in range(rank + 1)],
                                      [rank + 1] * n]
        assert result["alltoall_traced"] == result["alltoall"][0]
        mixed = [100 * r + 2 * rank + k for r in range(n) for k in range(2)]
        assert result["alltoall_mixed"] == ([mixed, [2] * n] if rank in (0, 1) else mixed)
        assert result["alltoall_equal"] == [100 * r + 2 * rank + k for r in range(n)
                                            for k in range(2)]
        # Each row sent to rank j comes back times j + 1; the unsent row gets 0.
        assert result["alltoall_gradient"] == [
            j + 1.0 for j in range(n) for _ in range(j + 1)] + [0.0]
        total = n * (n + 1) / 2  # the sum over ranks of rank + 1
        mine = range(0, 3) if rank == 0 else range(2 * rank + 1, 2 * rank + 3)
        assert result["reducescatter"] == [[total * r for r in mine], [total * r / n for r in mine]]
        assert result["grouped_reducescatter"] == [
            [[int((n - 1) / 2), 1, 5][k % 3] for k in range(3 * rank, 3 * rank + 3)],
            [total * rank / n]]
        mean = (n + 1) / 2  # of rank + 1
        local = float(np.float32(rank + 1) / np.float32(n))
        assert result["local_and_global"] == [[[True, local]], [[True, mean]]]
        assert result["local_optimizers"] == [-local, -mean, -local, -mean]
        # Horovod's gradient of a Sum: the gathered upstream gradients times the size.
        assert result["reducescatter_gradient"] == [
            n * (r + 1.0) for r in range(n) for _ in range(3 if r == 0 else 2)]
        # Uneven first dimensions: rank r gives r + 1 rows of r.
        assert result["gathered"] == [[float(r)] * 2 for r in range(n) for _ in range(r + 1)]
        assert result["grouped_gathered"] == [[r for r in range(n) for _ in range(r + 1)],
                                              [[float(r)] for r in range(n)]]
        assert result["as_tensors"] == [rank, n, rank, n]  # one host
        assert result["gathered_bool"] == [r % 2 == 0 for r in range(n)]
        assert result["broadcast"] == [(n - 1) * 10.0, 1.0]  # from the last rank
        assert result["object"] == {"from": 1, "text": "x"}
        assert result["objects"] == [["rank", r] for r in range(n)]
        assert result["slices"] == [[[float(np.float32(r) / np.float32(n))] for r in range(n)],
                                    list(range(n))]
        assert result["grouped"] == [[ranks.sum(), 2 * ranks.sum()],
                                     [[n * (n - 1) / 2]], [n * (n - 1) // 2]]
        assert result["traced"] == [[ranks.sum(), 2 * ranks.sum()],
                                    [[v] for r in ranks for v in (r, 2 * r)]]
        # Horovod's gradient of a Sum all-reduce: the Sum of the upstream ones.
        assert result["allreduce_gradient"] == [(rank + 1.0) * n] * 2
        assert result["broadcast_variables"] == [0.0] * 3  # rank 0's, on every rank
        weights, bias = one_device_training(n)
        for mode in ("eager", "tf_function", "keras_apply"):
            np.testing.assert_allclose(result[f"trained_{mode}"][0], weights, rtol=1e-5)
            np.testing.assert_allclose(result[f"trained_{mode}"][1], bias, rtol=1e-5)
        # Four gradients of one dtype: one all-reduce per step, the check
        # that every process issues it riding inside.
        assert result["collectives_per_step"] == ["CollectiveReduceV2"]
        assert result["fused_gradients"] == [[[2.0, 2.0], [2.0, 2.0]], [2.0], [2.0] * 3, 4.0]
        assert ("tfdtape: a collective across processes in a function XLA compiles "
                "(tfdtape.horovod): expected a step traced without XLA, found "
                "jit_compile=True") in result["xla"]  # AutoGraph adds the user's line
        assert result["session_graph"].startswith(
            "tfdtape: a collective across processes in a TensorFlow 1 graph "
            "(tfdtape.horovod): expected an eager call or a tf.function")
    # Every rank trained to the same bits.
    assert len({json.dumps([r["trained_eager"], r["trained_tf_function"],
                            r["trained_keras_apply"]])
                for r in found.values()}) == 1


@pytest.mark.cluster
@pytest.mark.per_release(False)
def test_a_rank_that_fails_ends_the_job_instead_of_a_hang(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(
        "import os\n"
        "os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')\n"
        "import tensorflow as tf\n"
        "import tfdtape.horovod as hvd\n"
        "hvd.init()\n"
        "hvd.allreduce(tf.constant(1.0))\n"
        "if hvd.rank() == 1:\n"
        "    raise SystemExit(5)\n"
        "hvd.allreduce(tf.constant(2.0))  # rank 1 never joins\n"
        "print('unreachable', flush=True)\n")
    completed = subprocess.run(
        [sys.executable, "-m", "tfdtape", "launch", "-np", "2", "--grace", "3",
         sys.executable, str(script)],
        capture_output=True, text=True, timeout=240,
        env={k: v for k, v in os.environ.items() if k != "TF_CONFIG"})
    assert completed.returncode == 5
    assert "unreachable" not in completed.stdout
    assert completed.stderr.splitlines()[-1] == (
        "tfdtape launch: rank 1 exited with status 5; the other processes were stopped")


def test_the_smaller_calls_of_horovod_s_api_alone(alone):
    """The rank and sizes as int32 tensors, the in-place broadcast, the
    grouped allgather; the TensorFlow 1 global variables broadcast refused
    eagerly as Horovod refuses it, and in a graph, whose session cannot
    reach the other processes."""
    for op, value in ((hvd.rank_op, 0), (hvd.size_op, 1), (hvd.local_rank_op, 0),
                      (hvd.local_size_op, 1)):
        tensor = op()
        assert tensor.dtype == tf.int32 and int(tensor) == value
    variables = [tf.Variable([1.0, 2.0])]
    assert hvd.broadcast_(variables, 0) == variables
    assert variables[0].numpy().tolist() == [1.0, 2.0]
    assert hvd.broadcast_(variables[0], 0) is variables[0]  # one variable
    gathered = hvd.grouped_allgather([tf.constant([1, 2]), tf.constant([[3.0]])])
    assert [t.numpy().tolist() for t in gathered] == [[1, 2], [[3.0]]]
    with pytest.raises(RuntimeError, match=r"broadcast_global_variables was called eagerly "
                                           r".*call hvd.broadcast_variables\("):
        hvd.broadcast_global_variables(0)
    with tf.Graph().as_default():
        tf.compat.v1.Variable(1.0)
        with pytest.raises(NotImplementedError, match=r"called in a graph .*a TensorFlow 1 "
                                                      r"graph, whose session runs on this"):
            hvd.broadcast_global_variables(0)


def test_the_keras_module_takes_horovod_s_keras_signatures_alone(alone):
    """horovod.tensorflow.keras's collectives take a value and a name
    second; its callbacks are a module too."""
    import tfdtape.horovod.keras as hvd_keras
    import tfdtape.horovod.keras.callbacks as callbacks_module
    assert hvd_keras.allreduce(np.array([1.0, 2.0]), "metric").numpy().tolist() == [1.0, 2.0]
    assert hvd_keras.allreduce([3], "count", op=hvd.Sum).numpy().tolist() == [3]
    assert hvd_keras.allgather(np.ones((2, 1), np.float32), "rows").shape == (2, 1)
    assert float(hvd_keras.broadcast(5.0, 0, "value")) == 5.0
    assert hvd_keras.callbacks is callbacks_module
    assert callbacks_module.MetricAverageCallback is hvd_keras.callbacks.MetricAverageCallback


def test_load_model_gives_the_saved_optimizer_distributed_alone(alone, tmp_path):
    """load_model restores the optimizer's state and wraps it: training on
    goes as with Keras's own load_model (a job of one)."""
    import tfdtape.horovod.keras as hvd_keras
    features = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3)
    labels = np.ones((4, 1), np.float32)
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
    model.compile(tf.keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    model.fit(features, labels, batch_size=4, epochs=1, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = hvd_keras.load_model(path)
    plain = tf.keras.models.load_model(path)
    assert type(loaded.optimizer).__name__ == "SGD"
    assert "_tfdtape_horovod" in vars(loaded.optimizer)
    assert int(loaded.optimizer.iterations) == 1
    for each in (loaded, plain):
        each.fit(features, labels, batch_size=4, epochs=2, verbose=0)
    for found, expected in zip(loaded.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(found, expected, rtol=1e-6)
    assert int(loaded.optimizer.iterations) == 3


def test_the_broadcast_callback_keeps_the_local_variables(alone, monkeypatch):
    """BroadcastGlobalVariablesCallback(local_variables=...) broadcasts the
    model's and optimizer's variables but those."""
    import tfdtape.horovod.keras.callbacks as callbacks_module
    broadcast = []
    monkeypatch.setattr(callbacks_module.ops, "broadcast_variables",
                        lambda variables, root_rank: broadcast.append(
                            ([id(v) for v in variables], root_rank)))
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
    model.compile(tf.keras.optimizers.SGD(0.1), loss="mse")
    kernel, bias = model.layers[0].kernel, model.layers[0].bias
    callback = callbacks_module.BroadcastGlobalVariablesCallback(1, local_variables=[bias])
    callback.set_model(model)
    callback.on_train_begin()
    (sent, root_rank), = broadcast
    assert root_rank == 1 and id(kernel) in sent and id(bias) not in sent


@pytest.mark.skipif(not is_keras3(tf.keras), reason="Keras 3's LossScaleOptimizer")
@pytest.mark.parametrize("explicit", [False, True])
def test_each_step_under_a_loss_scale_all_reduces_once_alone(alone, monkeypatch, explicit):
    """mixed_float16, a job of one, compiled twice: every LossScaleOptimizer
    `compile` puts around the DistributedOptimizer (or the one the program
    wraps in it) all-reduces each step's gradients once, before its check;
    the optimizer inside does not all-reduce them again; and used alone
    afterwards, it all-reduces."""
    import tfdtape.horovod.keras as hvd_keras
    from tfdtape.horovod.keras import optimizer as optimizer_module
    reductions = []
    real = optimizer_module.ops.reduce_group
    monkeypatch.setattr(optimizer_module.ops, "reduce_group",
                        lambda tensors, *args, **kwargs: reductions.append(len(tensors))
                        or real(tensors, *args, **kwargs))
    features, labels = np.ones((4, 3), np.float32), np.ones((4, 1), np.float32)
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
        inner = tf.keras.optimizers.SGD(0.1)
        distributed = hvd_keras.DistributedOptimizer(
            tf.keras.optimizers.LossScaleOptimizer(inner) if explicit else inner)
        for _ in range(2):
            model.compile(distributed, loss="mse", run_eagerly=True)
            assert type(model.optimizer).__name__ == "LossScaleOptimizer"
            assert "_tfdtape_horovod" in vars(model.optimizer)
            reductions.clear()
            model.fit(features, labels, batch_size=2, epochs=1, verbose=0)
            assert reductions == [2, 2]  # kernel and bias, once per step
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    if not explicit:
        reductions.clear()
        variables = model.trainable_variables
        distributed.apply([tf.ones(v.shape) for v in variables], variables)
        assert reductions == [2]


def test_the_keras_optimizer_refuses_what_it_does_not_do(alone):
    import tfdtape.horovod.keras as hvd_keras
    for passes in (0, 1.5):
        with pytest.raises(ValueError, match="backward_passes_per_step is not a count of "
                                             "passes .*expected a whole number, 1 or more"):
            hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.1),
                                           backward_passes_per_step=passes)
    with pytest.raises(ValueError, match="gradient_predivide_factor was given with an op"):
        hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), op=hvd.Sum,
                                       gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="expected a Keras optimizer, found str"):
        hvd_keras.DistributedOptimizer("sgd")


def test_keras_fit_alone_with_the_optimizer_and_the_schedule(alone):
    """A job of one: fit with DistributedOptimizer trains as the optimizer
    does; the schedule sets each epoch's learning rate; the metric average
    keeps the logs."""
    import tfdtape.horovod.keras as hvd_keras
    features = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3)
    labels = np.ones((4, 1), np.float32)
    models = []
    for distributed in (False, True):
        model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(
            1, kernel_initializer="zeros")])
        optimizer = tf.keras.optimizers.SGD(0.1)
        model.compile(hvd_keras.DistributedOptimizer(optimizer) if distributed else optimizer,
                      loss="mse")
        history = model.fit(features, labels, batch_size=4, epochs=3, verbose=0, callbacks=[
            hvd_keras.callbacks.LearningRateScheduleCallback(0.1, 0.5, start_epoch=1),
            hvd_keras.callbacks.MetricAverageCallback()])
        models.append((model.get_weights(), history.history))
    (plain, plain_history), (distributed, distributed_history) = models
    for expected, found in zip(plain, distributed):  # rounding apart
        np.testing.assert_allclose(found, expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(distributed_history["loss"], plain_history["loss"], rtol=1e-6)
    np.testing.assert_allclose(distributed_history["lr"], [0.1, 0.05, 0.05])


@pytest.mark.cluster
@pytest.mark.parametrize("processes", [2, pytest.param(3, marks=pytest.mark.per_release(False))])
def test_keras_fit_with_the_distributed_optimizer_trains_like_one_device(processes):
    """Processes starting from other weights (aligned by the broadcast
    callback), each fitting its rows: one device's training on the global
    batch; the averaged losses are the global batch's."""
    completed = launch(processes, "keras_fit.py")
    assert completed.returncode == 0, completed.stderr[-3000:]
    found = outputs(completed)
    assert sorted(found) == list(range(processes))
    weights, bias = one_device_training(processes)
    rows = 6 * processes
    features = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3) / 10.0
    labels = features @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 1.0
    losses, w, b = [], np.zeros((3, 1), np.float32), np.zeros(1, np.float32)
    for _ in range(3):
        error = features @ w + b - labels
        losses.append(float(np.mean(error ** 2)))
        w = w - 0.1 * (2.0 * features.T @ error / rows)
        b = b - 0.1 * (2.0 * error.mean(axis=0))
    for result in found.values():
        assert result["optimizer"] == "SGD"
        np.testing.assert_allclose(result["weights"][0], weights, rtol=1e-5)
        np.testing.assert_allclose(result["weights"][1], bias, rtol=1e-5)
        np.testing.assert_allclose(result["loss"], losses, rtol=1e-5)
    assert all(result == dict(found[0], rank=rank) for rank, result in found.items())


def test_the_warmup_reaches_the_initial_rate_on_its_last_batch(alone, monkeypatch, capsys):
    """Horovod's warmup on a job of 2 (its size stood in): 2 epochs of 2
    batches from 0.1 / 2 up, each batch counted as ended, then 0.1 kept."""
    import tfdtape.horovod.keras as hvd_keras
    monkeypatch.setattr(hvd.basics, "size", lambda: 2)
    model = tf.keras.Sequential([tf.keras.Input((1,)), tf.keras.layers.Dense(1)])
    model.compile(tf.keras.optimizers.SGD(0.1), loss="mse")
    warmup = hvd_keras.callbacks.LearningRateWarmupCallback(
        0.1, warmup_epochs=2, steps_per_epoch=2, verbose=1)
    warmup.set_model(model)
    rates = []
    for epoch in range(3):
        warmup.on_epoch_begin(epoch)
        for batch in range(2):
            warmup.on_batch_begin(batch)
            rates.append(float(model.optimizer.learning_rate))
        warmup.on_epoch_end(epoch, {})
    np.testing.assert_allclose(rates, [0.0625, 0.075, 0.0875, 0.1, 0.1, 0.1], rtol=1e-6)
    assert capsys.readouterr().out == "\nEpoch 2: finished gradual learning rate warmup to 0.1.\n"


def two_pass_steps(epochs):
    """Weights and bias after `epochs` applies of 2 processes' fit with 2
    backward passes per step (keras_fit.py's rows): each the sum of two
    global mini-batches' gradients (NumPy)."""
    features = np.arange(36, dtype=np.float32).reshape(12, 3) / 10.0
    labels = features @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 1.0
    w, b = np.zeros((3, 1), np.float32), np.zeros(1, np.float32)
    for _ in range(epochs):  # one apply each
        step_w, step_b = np.zeros_like(w), np.zeros_like(b)
        for k in range(2):  # the passes: mini-batch k of every process
            rows = [6 * r + 3 * k + i for r in range(2) for i in range(3)]
            error = features[rows] @ w + b - labels[rows]
            step_w += 2.0 * features[rows].T @ error / len(rows)
            step_b += 2.0 * error.mean(axis=0)
        w, b = w - 0.1 * step_w, b - 0.1 * step_b
    return w, b


@pytest.mark.cluster
@pytest.mark.per_release(False)
def test_keras_fit_accumulating_backward_passes_applies_their_sum_every_nth():
    """backward_passes_per_step=2 on two processes: each apply is the sum of
    two mini-batches' gradients averaged over the processes (Horovod's
    default, not averaged over the passes), every pass counted in
    `iterations`."""
    completed = launch(2, "keras_fit.py", "2", "2")
    assert completed.returncode == 0, completed.stderr[-3000:]
    found = outputs(completed)
    w, b = two_pass_steps(2)
    for result in found.values():
        np.testing.assert_allclose(result["weights"][0], w.ravel(), rtol=1e-5)
        np.testing.assert_allclose(result["weights"][1], b, rtol=1e-5)
        assert result["iterations"] == 4
    assert found[0] == dict(found[1], rank=0)


@pytest.mark.cluster
@pytest.mark.parametrize("keras", ["keras", "tf_keras"] if is_keras3(tf.keras) else ["keras"])
def test_adam_accumulating_passes_trains_as_one_device_on_the_global_batches(keras):
    """Adam (slots, and a bias correction that reads `iterations`, which
    counts every pass as Horovod's does) in fit with 2 backward passes per
    step on 2 processes: what one device applies to the same global
    mini-batches, ranks bitwise equal; with `tf.keras` and, where that is
    Keras 3 (TensorFlow 2.16+), also with tf_keras."""
    legacy = {"TF_USE_LEGACY_KERAS": "1" if keras == "tf_keras" else "0"}
    completed = launch(2, "keras_fit.py", "2", "2", "adam", env=legacy)
    assert completed.returncode == 0, completed.stderr[-3000:]
    found = outputs(completed)
    alone = subprocess.run(
        [sys.executable, str(SCRIPTS / "keras_fit.py"), "2", "2", "adam", "2"],
        capture_output=True, text=True, timeout=240,
        env={**{k: v for k, v in os.environ.items() if k != "TF_CONFIG"}, **legacy,
             "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert alone.returncode == 0, alone.stderr[-3000:]
    reference = json.loads(alone.stdout.splitlines()[-1])
    assert reference["keras"] == found[0]["keras"] == keras
    assert found[0] == dict(found[1], rank=0)
    assert found[0]["optimizer"] == "Adam" and found[0]["iterations"] == 4
    for expected, weights in zip(reference["weights"], found[0]["weights"]):
        np.testing.assert_allclose(weights, expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(found[0]["loss"], reference["loss"], rtol=1e-6)
    assert not np.allclose(found[0]["weights"][1], 0.0)  # it trained


@pytest.mark.cluster
@pytest.mark.parametrize("keras", ["keras", "tf_keras"] if is_keras3(tf.keras) else ["keras"])
@pytest.mark.parametrize("wrapping", ["by_compile", "by_the_program"])
def test_mixed_precision_fit_skips_the_step_one_process_overflows_on_all(keras, wrapping):
    """mixed_float16: the loss scale's first step overflows on one process's
    rows only. The gradients are all-reduced before the LossScaleOptimizer
    checks them (wrapped by `compile` around the DistributedOptimizer, or
    by the program inside it, accumulating 2 passes), so every process
    skips that step, halves its scale and applies the next ones: what one
    device applies on the global batch after the skipped step (float16's
    rounding apart), ranks bitwise equal. (Checked on each process's own
    gradients, one process would skip and the other would wait in the
    all-reduce: the job hung.)"""
    env = {"TF_USE_LEGACY_KERAS": "1" if keras == "tf_keras" else "0",
           "KERAS_FIT_POLICY": "mixed_float16"}
    if wrapping == "by_the_program":
        env["KERAS_FIT_WRAP_LOSS_SCALE"] = "1"
        completed = launch(2, "keras_fit.py", "2", "2", env=env)
        expected = two_pass_steps(1)
        iterations = {True: 3, False: 4}
    else:
        completed = launch(2, "keras_fit.py", env=env)
        expected = one_device_training(2, steps=2)
        iterations = {True: 2, False: 3}
    assert completed.returncode == 0, completed.stderr[-3000:]
    found = outputs(completed)
    assert found[0] == dict(found[1], rank=0)
    result = found[0]
    assert result["keras"] == keras
    assert result["optimizer"].startswith("LossScaleOptimizer")
    assert result["scale"] == 2.0 ** 14  # 2 ** 15, halved once
    assert result["loss"][0] == result["loss"][1]  # the first step skipped
    keras3 = keras == "keras" and is_keras3(tf.keras)
    assert result["iterations"] == iterations[keras3]  # Keras 2 counts skipped steps
    for weights, wanted in zip(result["weights"], expected):
        np.testing.assert_allclose(weights, np.ravel(wanted), rtol=5e-3)


@pytest.mark.cluster
@pytest.mark.per_release(False)
def test_tf_keras_loss_scale_around_an_accumulating_optimizer_is_refused():
    """Keras 2's LossScaleOptimizer (tf_keras, or tf.keras before 2.16),
    wrapped by `compile` around a DistributedOptimizer that accumulates
    passes, would check each process's own gradients: refused, naming the
    wrapping that works."""
    completed = launch(2, "keras_fit.py", "2", "2",
                       env={"TF_USE_LEGACY_KERAS": "1", "KERAS_FIT_POLICY": "mixed_float16"})
    assert completed.returncode == 1
    assert ("ValueError: tfdtape: a LossScaleOptimizer checks gradients this "
            "DistributedOptimizer accumulates") in completed.stderr
    assert ("wrap the LossScaleOptimizer instead: DistributedOptimizer(LossScaleOptimizer("
            "optimizer), backward_passes_per_step=N)") in completed.stderr


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("average", [False, True])
def test_accumulated_passes_apply_on_every_nth_call_alone(alone, traced, average):
    """A custom loop, a job of one: the first call only accumulates (the
    weights stay, `iterations` counts it), the second applies the sum (or
    mean) of both passes' gradients and resets the accumulators."""
    import tfdtape.horovod.keras as hvd_keras
    w = tf.Variable([1.0, 2.0])
    optimizer = hvd_keras.DistributedOptimizer(
        tf.keras.optimizers.SGD(0.5), backward_passes_per_step=2,
        average_aggregated_gradients=average)

    def step(scale):
        with tf.GradientTape() as tape:
            loss = scale * tf.reduce_sum(w * w)
        optimizer.apply_gradients([(tape.gradient(loss, w), w)])

    if traced:
        step = tf.function(step)
    step(tf.constant(1.0))
    np.testing.assert_array_equal(w.numpy(), [1.0, 2.0])
    step(tf.constant(3.0))  # gradients 2w and 6w at w = [1, 2]: sum 8w
    summed = 8.0 * np.array([1.0, 2.0]) / (2.0 if average else 1.0)
    np.testing.assert_allclose(w.numpy(), np.array([1.0, 2.0]) - 0.5 * summed, rtol=1e-6)
    assert int(optimizer.iterations) == 2
    step(tf.constant(1.0))  # accumulates from zero again: no apply
    np.testing.assert_allclose(w.numpy(), np.array([1.0, 2.0]) - 0.5 * summed, rtol=1e-6)


DIFFERENCES = {
    "kind": "kind of collective", "op": "reduction op", "root": "root rank",
    "dtype": "dtypes", "shape": "shape", "trailing": "shape", "count": "number of tensors",
    "group_shapes": "shapes", "variables": "shape", "name": "name",
    "integer_average": "dtypes", "alltoall_trailing": "shape", "reducescatter_dtype": "dtypes",
    "extra": "shape"}


@pytest.mark.cluster
@pytest.mark.per_release(False)
@pytest.mark.parametrize("processes,mode", [(2, "eager"), (2, "tf_function"), (3, "eager")])
def test_processes_issuing_different_collectives_all_refuse_and_go_on(processes, mode):
    """Horovod's coordinator refuses collectives that differ between the
    processes (its tests: FailedPreconditionError on every rank). Every
    process refuses each difference with the same error naming it (eagerly
    Horovod's FailedPreconditionError; in a tf.function the assertion's
    InvalidArgumentError), before the collective pairs different tensors;
    an all-reduce after each still gives the sum of the ranks."""
    completed = launch(processes, "disagreeing.py", mode)
    assert completed.returncode == 0, completed.stderr[-3000:]
    error = "FailedPreconditionError" if mode == "eager" else "InvalidArgumentError"
    different = "tfdtape: the processes of the job issued different collectives "
    expected = [{"case": case, "refused": error,
                 "says": different + f"(they differ in {field})"}
                for case, field in DIFFERENCES.items() if case != "extra"]
    expected += [{"case": case, "refused": error,
                  "says": "tfdtape: the processes of the job disagree on which "
                          "gradients are None"}
                 for case in ("none_on_one_rank", "slices_on_one_rank")[:2 if mode == "eager"
                                                                        else 1]]
    # A refusal of one process's tensors, decided by all; where all refuse
    # alike, eagerly the refusal itself (Horovod's ValueError).
    expected += [{"case": case, "refused": error,
                  "says": "tfdtape: processes of the job refused the collective"}
                 for case in ("scalar_on_one_rank", "splits_on_one_rank")]
    expected.append({"case": "scalars_on_every_rank",
                     "refused": "ValueError" if mode == "eager" else error,
                     "says": "tfdtape: a scalar was to be reduce-scattered" if mode == "eager"
                     else "tfdtape: processes of the job refused the collective"})
    expected.append({"case": "extra", "refused": error,
                     "says": different + "(they differ in shape)"})
    by_rank = {}
    for line in completed.stdout.splitlines():
        prefix, _, text = line.partition("<stdout>:")
        by_rank.setdefault(int(prefix.strip("[]")), []).append(json.loads(text))
    assert by_rank == {rank: expected for rank in range(processes)}


@pytest.mark.parametrize("scale", [1.0, 1.0 / 3.0, 0.1 / 7.0])
def test_a_check_riding_in_a_sum_finds_exactly_the_fields_that_differ(monkeypatch, scale):
    """Three processes' riders summed (scaled as an all-reduce scales them):
    no field differs where all agree; where one process's shapes (or which
    gradients are None) differ, that field alone, on every process alike;
    also where the processes' values average to one process's own."""
    from tfdtape.horovod import negotiation
    monkeypatch.setattr(negotiation.collectives, "size", lambda: 3)
    field = negotiation._FIELDS.index

    def differs(*groups):
        riders = [negotiation.rider("gradient all-reduce", tensors, tf.float32, hvd.Sum,
                                    absent)
                  for tensors, absent in groups]
        reduced = tf.add_n([rider * scale for rider in riders])
        return negotiation.rider_differs(reduced, scale).numpy().tolist()

    same = ([tf.ones([2, 3]), tf.ones([4])], ())
    assert differs(same, same, same) == [False] * 8
    other_shape = ([tf.ones([3, 2]), tf.ones([4])], ())
    assert differs(same, other_shape, same) == [i == field("shapes") for i in range(8)]
    none = ([tf.ones([2, 3]), tf.ones([4])], (2,))
    assert differs(same, same, none) == [
        i == field("gradients that are None") for i in range(8)]
    counts = [([tf.ones([1])] * count, ()) for count in (1, 2, 3)]  # 2 is their mean
    assert differs(*counts)[field("number of tensors")]


def test_a_shape_known_only_when_run_gives_the_same_check():
    """One process may know a shape when tracing where another learns it
    only when running (a relaxed retrace): the same rider either way."""
    from tfdtape.horovod import negotiation
    slices = tf.IndexedSlices(tf.ones([5, 3]), tf.range(5), tf.constant([9, 3]))

    def rider(matrix, rows):
        return negotiation.rider("gradient all-reduce", [matrix, tf.IndexedSlices(
            rows, tf.range(tf.shape(rows)[0]), tf.constant([9, 3]))], tf.float64, hvd.Sum)

    known = rider(tf.ones([2, 3]), slices.values).numpy()
    traced = tf.function(rider, input_signature=[
        tf.TensorSpec([None, None]), tf.TensorSpec([None, None])])
    np.testing.assert_array_equal(traced(tf.ones([2, 3]), tf.ones([7, 3])).numpy(), known)
    assert not np.array_equal(traced(tf.ones([3, 2]), tf.ones([7, 3])).numpy(), known)


def test_the_refusal_names_what_each_process_issued(alone, monkeypatch):
    """The eager message gives each process's value of the first field
    that differs; an all-gather's shapes show each process's rows."""
    from tfdtape.horovod import negotiation
    rows = [negotiation.describe("allgather", [tf.ones([rows, 3])], rows=rows)
            for rows in (2, 5)]
    found = np.stack([rows[0].numpy(), rows[1].numpy()])
    assert (found[0] != found[1]).tolist() == [
        column == negotiation._ROWS for column in range(found.shape[1])]  # the rows alone
    shapes = np.stack([negotiation.describe("allreduce", [tf.ones(shape)]).numpy()
                       for shape in ([2, 3], [2, 3, 1, 1, 1, 4, 5])])
    field = negotiation._FIELDS.index
    assert negotiation._found(field("shape"), shapes) == (
        "process 0: [2, 3], process 1: [2, 3, 1, 1, 1, '20 in all']")
    kinds = np.stack([negotiation.describe(kind, [tf.ones([2])], op=op).numpy()
                      for kind, op in (("allreduce", hvd.Sum), ("broadcast", -1))])
    assert negotiation._found(field("kind of collective"), kinds) == (
        "process 0: allreduce, process 1: broadcast")
    assert negotiation._found(field("reduction op"), kinds) == "process 0: Sum, process 1: none"
    dtypes = np.stack([negotiation.describe("allreduce", [tf.ones([2], dtype)]).numpy()
                       for dtype in (tf.float32, tf.int64)])
    assert negotiation._found(field("dtypes"), dtypes) == "process 0: float32, process 1: int64"


def elastic_job(form, tmp_path, fail=None):
    """Each rank's JSON of elastic_training.py FORM on 2 processes under
    --max-restarts 1 (with fail=(RANK, EPOCH): that rank ends with
    os._exit as batch 1 of that epoch begins on the first attempt), and the
    launcher's stderr."""
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=os.pathsep.join(
        [str(SCRIPTS.parent), os.environ.get("PYTHONPATH", "")]))
    if fail:
        environment[fault_points.ENVIRONMENT] = fault_points.spec(0, fail[0], "batch", fail[1],
                                                                  "exit")
    environment.pop("TF_CONFIG", None)
    completed = subprocess.run(
        [sys.executable, "-m", "tfdtape", "launch", "-np", "2", "--grace", "3",
         "--max-restarts", "1", sys.executable, str(SCRIPTS / "elastic_training.py"), form],
        capture_output=True, text=True, env=environment, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return outputs_of_json(completed.stdout), completed.stderr


@pytest.mark.per_release(False)
@pytest.mark.cluster
@pytest.mark.parametrize("form", ["fit", "loop"])
def test_elastic_run_resumes_a_restarted_job_from_its_last_commit(form, tmp_path):
    """Horovod's elastic Keras example (fit) and a custom loop, each
    committing every epoch: rank 1 ends in epoch 2, the launcher restarts
    the job, every rank resumes from the commit of epoch 1 (the reset
    callbacks run once) and ends with the uninterrupted job's variables,
    bitwise. The loop is one device on the global batches (the example's
    first `fit` step, before the state is made, averages gradients of each
    rank's own weights)."""
    uninterrupted, _ = elastic_job(form, tmp_path)
    restarted, stderr = elastic_job(form, tmp_path, fail=(1, 2))
    assert "tfdtape launch: rank 1 exited with status 3;" in stderr
    assert "restarting every process (attempt 1 of 1)" in stderr
    for rank in (0, 1):
        assert uninterrupted[rank]["epochs"] == [0, 1, 2, 3]
        assert (restarted[rank]["epochs"], restarted[rank]["resets"]) == ([2, 3], 1)
        assert restarted[rank]["variables"] == uninterrupted[0]["variables"]
        assert uninterrupted[rank]["variables"] == uninterrupted[0]["variables"]
    if form == "fit":
        return
    alone = subprocess.run(
        [sys.executable, str(SCRIPTS / "elastic_training.py"), form],
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", AS_JOB_OF="2",
                 TFDTAPE_LAUNCH_DIR=str(tmp_path), PYTHONPATH=os.pathsep.join(
                     [str(SCRIPTS.parent), os.environ.get("PYTHONPATH", "")])),
        capture_output=True, text=True, timeout=300)
    assert alone.returncode == 0, alone.stderr[-3000:]
    reference = json.loads(alone.stdout.splitlines()[-1])
    for found, wanted in zip(uninterrupted[0]["variables"], reference["variables"],
                             strict=True):
        np.testing.assert_allclose(found, wanted, rtol=1e-5, atol=1e-6)


def test_an_elastic_commit_is_written_whole_and_run_resumes_from_it(
        alone, monkeypatch, tmp_path):
    monkeypatch.setenv("TFDTAPE_LAUNCH_DIR", str(tmp_path))
    monkeypatch.setenv("TFDTAPE_RESTART_COUNT", "1")
    variable = tf.Variable([1.0, 2.0])
    state = hvd.elastic.TensorFlowState([variable], epoch=0, seen=[])
    resets = []
    state.register_reset_callbacks([lambda: resets.append(state.epoch)])
    state.epoch, state.seen = 3, ["a"]
    variable.assign([5.0, 6.0])
    state.commit()
    assert [path.name for path in tmp_path.iterdir()] == [state._file_name]
    state.epoch, state.seen = 4, ["a", "b"]
    variable.assign([7.0, 8.0])
    state.restore()  # the last save, in memory
    assert (state.epoch, state.seen, variable.numpy().tolist()) == (3, ["a"], [5.0, 6.0])
    state.epoch = 9
    variable.assign([0.0, 0.0])

    @hvd.elastic.run
    def train(state, more):
        return state.epoch, state.seen, variable.numpy().tolist(), more

    assert train(state, "x") == (3, ["a"], [5.0, 6.0], "x")  # the commit, put back
    assert resets == [3]  # a restarted attempt: after the commit is in place


def test_elastic_state_refuses_what_a_restarting_job_cannot_keep(alone, monkeypatch):
    monkeypatch.delenv("TFDTAPE_LAUNCH_DIR", raising=False)
    state = hvd.elastic.ObjectState(epoch=0)
    with pytest.raises(RuntimeError, match="Horovod's elastic state has nowhere to keep its "
                                           "commits.*--max-restarts N"):
        hvd.elastic.run(lambda state: None)(state)
    with pytest.raises(NotImplementedError, match="TensorFlowState of a TensorFlow 1 session"):
        hvd.elastic.TensorFlowState([tf.Variable(1.0)], session=object())
    with pytest.raises(NotImplementedError, match="Pass the variables to keep"):
        hvd.elastic.TensorFlowState()
    variables = hvd.elastic.TensorFlowState([tf.Variable(1.0)])
    with pytest.raises(ValueError, match="the elastic state's commit does not fit"):
        variables._resume({"objects": {}, "variables": [1.0, 2.0]})


def outputs_of_json(stdout):
    found = {}
    for line in stdout.splitlines():
        prefix, _, text = line.partition("<stdout>:")
        if text.startswith("{"):
            found[int(prefix.strip("[]"))] = json.loads(text)
    return found


@pytest.mark.per_release(False)
@pytest.mark.cluster
def test_horovods_checkpoint_on_rank_0_resumes_a_restarted_job(tmp_path, tmp_path_factory):
    """keras_mnist_advanced.py's way: rank 0 checkpoints every epoch; after
    rank 1 ends in epoch 2 the restarted job finds epoch 2's checkpoint,
    rank 0 loads it (the optimizer's state too) and hands it out, and every
    rank ends with the uninterrupted job's variables, bitwise."""
    (tmp_path / "restarted").mkdir()
    uninterrupted = restart_jobs.uninterrupted("horovod", tmp_path_factory)[1].ranks
    job = restart_jobs.launch("horovod", tmp_path / "restarted", restarts=1,
                              env={"FAULTS": "0:1:batch:2:exit"})
    assert job.status == 0, job.stderr[-3000:]
    restarted, stderr = job.ranks, job.stderr
    assert "restarting every process (attempt 1 of 1)" in stderr
    for rank in (0, 1):
        assert uninterrupted[rank]["epochs"] == [0, 1, 2, 3]
        assert restarted[rank]["epochs"] == [2, 3]
        assert restarted[rank]["variables"] == uninterrupted[0]["variables"]
    assert sorted(os.listdir(tmp_path / "restarted")) == [
        f"checkpoint-{epoch}.keras" for epoch in (1, 2, 3, 4)]


def test_a_fit_that_ran_no_batch_broadcasts_the_model_and_optimizer_at_its_end(
        alone, monkeypatch):
    """Found by the generated faults (tests/test_generated_faults.py, a
    Horovod checkpoint job restarted after its fit ended): a fit resuming at
    its last epoch runs no batch, so the first batch's broadcast never came
    and the other ranks kept an optimizer of their own, not even built."""
    import tfdtape.horovod.keras as hvd_keras
    from tfdtape.horovod import ops
    broadcasts = []
    monkeypatch.setattr(ops, "broadcast_variables",
                        lambda variables, root: broadcasts.append((list(variables), root)))
    keras = tf.keras
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    optimizer = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9))
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(np.ones((4, 2), np.float32), np.zeros((4, 1), np.float32), epochs=2,
              initial_epoch=2, verbose=0,
              callbacks=[hvd_keras.callbacks.BroadcastGlobalVariablesCallback(1)])
    slots = optimizer.variables() if callable(optimizer.variables) else optimizer.variables
    # the iterations, two momentums (and Keras 3's learning rate)
    assert len(slots) == (4 if is_keras3(keras) else 3)
    assert [(len(variables), root) for variables, root in broadcasts] == [
        (2, 1), (2 + len(slots), 1)]
    assert {id(v) for v in slots} <= {id(v) for v in broadcasts[1][0]}
    broadcasts.clear()  # a later fit: its first batch does not hand them out again
    model.fit(np.ones((4, 2), np.float32), np.zeros((4, 1), np.float32), epochs=1,
              verbose=0, callbacks=[hvd_keras.callbacks.BroadcastGlobalVariablesCallback(1)])
    assert [len(variables) for variables, _ in broadcasts] == [2, 2 + len(slots)]


def test_a_fit_that_ran_no_batch_leaves_what_it_cannot_build_to_the_next_fit(
        alone, monkeypatch):
    """The broadcast at the end of a fit that ran no batch: a model not
    built has nothing to hand out (its optimizer is not built on nothing),
    and an optimizer without `build` (tf_keras's legacy ones) waits for the
    next fit's first batch, which then hands both out."""
    import tfdtape.horovod.keras as hvd_keras
    from tfdtape.horovod import ops
    broadcasts = []
    monkeypatch.setattr(ops, "broadcast_variables",
                        lambda variables, root: broadcasts.append(len(list(variables))))
    keras = tf.keras

    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(1)

        def call(self, x):
            return self.dense(x)

    unbuilt = Subclassed()
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    unbuilt.compile(optimizer=optimizer, loss="mse")
    callback = hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0)
    unbuilt.fit(np.ones((4, 2), np.float32), np.zeros((4, 1), np.float32), epochs=2,
                initial_epoch=2, verbose=0, callbacks=[callback])
    assert broadcasts == [] and not callback.broadcast_done
    unbuilt.fit(np.ones((4, 2), np.float32), np.zeros((4, 1), np.float32), epochs=1,
                verbose=0, callbacks=[callback])  # trains: the optimizer was not spoiled
    assert callback.broadcast_done and len(broadcasts) == 1 and broadcasts[0] > 2
    if is_keras3(keras):
        return  # Keras 3 has no legacy optimizers
    broadcasts.clear()
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.legacy.SGD(0.1, momentum=0.9), loss="mse")
    callback = hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0)
    model.fit(np.ones((4, 2), np.float32), np.zeros((4, 1), np.float32), epochs=2,
              initial_epoch=2, verbose=0, callbacks=[callback])
    assert broadcasts == [2, 2] and not callback.broadcast_done  # the model's, twice
    model.fit(np.ones((4, 2), np.float32), np.zeros((4, 1), np.float32), epochs=1,
              verbose=0, callbacks=[callback])
    assert callback.broadcast_done and broadcasts[2:] == [2, 2 + 3]


def test_elastic_restore_of_a_save_made_before_the_optimizers_first_step(
        alone, monkeypatch, tmp_path):
    import tfdtape.horovod.keras as hvd_keras
    monkeypatch.setenv("TFDTAPE_LAUNCH_DIR", str(tmp_path / "made" / "by" / "commit"))
    keras = tf.keras
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    model.compile(optimizer=optimizer, loss="mse")
    state = hvd_keras.elastic.KerasState(model, epoch=0)  # Horovod's order: before fit
    first = [np.asarray(w).tolist() for w in model.weights]
    model.fit(np.ones((4, 2), np.float32), np.zeros((4, 1), np.float32), verbose=0)
    state.restore()  # Horovod restores the pairs there are
    assert [np.asarray(w).tolist() for w in model.weights] == first
    state.commit()  # into a directory made for it
    assert os.listdir(tmp_path / "made" / "by" / "commit") == [state._file_name]
    callback = hvd_keras.elastic.UpdateBatchStateCallback(hvd.elastic.ObjectState(batch=2))
    callback.set_params({"steps": 6})
    with pytest.warns(UserWarning, match="resuming from a commit after batch 2 of an "
                                         "epoch, which Keras's fit runs from its first"):
        callback.on_epoch_begin(0)
    assert callback.params["steps"] == 4  # as Horovod sets it


@pytest.mark.per_release(False)
@pytest.mark.cluster
def test_init_first_called_under_a_graph_leaves_eager_collectives_working():
    completed = launch(2, "graph_init.py")
    assert completed.returncode == 0, completed.stderr[-3000:]
    found = outputs(completed)
    assert [found[rank]["sum"] for rank in (0, 1)] == [[3.0, 6.0], [3.0, 6.0]]


@pytest.mark.per_release(False)
@pytest.mark.cluster
def test_a_tf_keras_model_fit_builds_trains_from_rank_0s_weights():
    """Horovod's tensorflow2_keras_mnist.py shape under tf_keras: the model
    has no Input, so it has no weights when training begins (reading them
    failed: "Weights for model 'sequential' have not yet been created");
    the broadcast after the first batch gives every rank rank 0's, and they
    end equal."""
    completed = launch(2, "built_by_fit.py", env={"TF_USE_LEGACY_KERAS": "1"})
    assert completed.returncode == 0, completed.stderr[-3000:]
    found = outputs(completed)
    assert found[0]["weights"] == found[1]["weights"]


def test_an_object_collective_in_a_tensorflow_1_graph_says_so(alone):
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match=r"expected an eager call \(objects are pickled "
                                             r"in Python\), found a TensorFlow 1 graph"):
            hvd.broadcast_object({"epoch": 1})


def test_float16_is_scaled_in_float32_as_horovod_scales_it(alone):
    values = np.array([0.1, 1.7, 333.0, -2.9], np.float16)
    scaled = hvd.allreduce(tf.constant(values), op=hvd.Sum, prescale_factor=0.3,
                           postscale_factor=1.7)
    in_float32 = (np.float32(0.3) * values.astype(np.float32)).astype(np.float16)
    in_float32 = (np.float32(1.7) * in_float32.astype(np.float32)).astype(np.float16)
    in_float16 = values * np.float16(0.3) * np.float16(1.7)
    assert scaled.dtype == tf.float16
    assert scaled.numpy().tobytes() == in_float32.tobytes()
    assert in_float16.tobytes() != in_float32.tobytes()  # the test tells them apart


def test_float64_is_scaled_in_float64(alone):
    """A scale factor meets a float64 tensor at float64's precision: a
    factor of 2/3 (Horovod's travels as a float32 attribute: 0.6666666865;
    a generated Horovod program found tfdtape's passing through float32
    too, docs/horovod.md). The mean of three accumulated passes is their
    all-reduced sum divided by 3, as Horovod divides it (not times 1/3)."""
    scaled = hvd.allreduce(tf.constant([1.0], tf.float64), op=hvd.Sum, postscale_factor=2 / 3)
    assert scaled.numpy().tolist() == [2 / 3]
    assert np.float64(np.float32(2 / 3)) != 2 / 3  # the test tells them apart
    variable = tf.Variable([0.0], dtype=tf.float64)
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(1.0), backward_passes_per_step=3,
                                         average_aggregated_gradients=True)
    for gradient in (1.0, 2.0, 2.0):
        optimizer.apply_gradients([(tf.constant([gradient], tf.float64), variable)])
    assert variable.numpy().tolist() == [-(5.0 / 3)]
    assert 5.0 * (1 / 3) != 5.0 / 3 and 5.0 * np.float64(np.float32(1 / 3)) != 5.0 / 3


@pytest.mark.parametrize("traced", [False, True])
def test_a_predivided_indexed_slices_gradient_is_refused_as_horovod(alone, traced):
    """Horovod's tape and optimizer split an Average with a
    gradient_predivide_factor into scale factors, which it refuses for
    IndexedSlices: so does tfdtape, in words naming the factor the user
    gave (not the scale factors it became); densified, the mean."""
    table = tf.Variable(tf.ones([4, 2]))

    def gradient(**options):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(table, [1, 1, 3]) * 3.0)
        return hvd.DistributedGradientTape(tape, gradient_predivide_factor=2.0,
                                           **options).gradient(loss, table)

    run = tf.function(gradient) if traced else gradient
    with pytest.raises(NotImplementedError) as raised:
        run()
    assert ("tfdtape: an IndexedSlices gradient was to be predivided "
            "(tfdtape.horovod.DistributedGradientTape)") in str(raised.value)
    assert "found gradient_predivide_factor=2.0" in str(raised.value)
    assert "sparse_as_dense=True" in str(raised.value)
    assert run(sparse_as_dense=True).numpy().tolist() == [[0, 0], [6, 6], [0, 0], [3, 3]]
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(1.0),
                                         gradient_predivide_factor=2.0)
    slices = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0]), tf.constant([4, 2]))
    with pytest.raises(NotImplementedError, match="an IndexedSlices gradient was to be "
                                                  "predivided .*DistributedOptimizer"):
        optimizer.apply_gradients([(slices, table)])
    assert table.numpy().tolist() == [[1, 1]] * 4  # nothing applied


@pytest.mark.parametrize("call, message", [
    (lambda x: hvd.allreduce(x, op=hvd.Max), "IndexedSlices were to be reduced by Max"),
    (lambda x: hvd.grouped_allreduce([x, tf.ones([2])], op=hvd.Product),
     "IndexedSlices were to be reduced by Product"),
    (lambda x: hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5),
     "IndexedSlices were to be scaled"),
    (lambda x: hvd.grouped_allreduce([x], postscale_factor=2.0),
     "IndexedSlices were to be scaled"),
])
def test_indexed_slices_refusals_are_horovods_not_implemented_error(alone, call, message):
    """Horovod gathers IndexedSlices, so it refuses Min, Max, Product and
    scale factors with NotImplementedError; values given as a Python list
    (Horovod's own test gives them so) are refused the same way."""
    for values in (tf.ones((1, 1)), [tf.ones(1), tf.ones(1)]):
        with pytest.raises(NotImplementedError) as raised:
            call(tf.IndexedSlices(values, tf.constant([0])))
        assert str(raised.value).startswith(f"tfdtape: {message} (tfdtape.horovod")


def test_integer_average_truncates_as_horovod_alone(alone):
    """Horovod averages integers as their sum times postscale / size in
    float64, truncated toward zero; alone the sum is the value."""
    averaged = hvd.allreduce(tf.constant([7, -7, 3], tf.int32), postscale_factor=0.5)
    assert averaged.dtype == tf.int32 and averaged.numpy().tolist() == [3, -3, 1]
    grouped = hvd.grouped_allreduce([tf.constant([5], tf.int64), tf.constant([2.5])],
                                    prescale_factor=0.5)
    assert grouped[0].dtype == tf.int64 and grouped[0].numpy().tolist() == [2]
    assert grouped[1].numpy().tolist() == [1.25]


def test_alltoall_and_reducescatter_alone(alone):
    """In a job of one, alltoall returns the rows sent to rank 0 (and the
    received splits where splits were given); reducescatter keeps every
    row; bad splits are InvalidArgumentError and an op other than Sum or
    Average is AbortedError, as Horovod raises them; eagerly and traced."""
    rows = tf.reshape(tf.range(6.0), [3, 2])
    assert hvd.alltoall(rows).numpy().tolist() == rows.numpy().tolist()
    output, received = hvd.alltoall(rows, splits=[2])
    assert output.numpy().tolist() == [[0.0, 1.0], [2.0, 3.0]]
    assert received.dtype == tf.int32 and received.numpy().tolist() == [2]
    traced = tf.function(lambda x: hvd.alltoall(x, splits=tf.constant([1])),
                         input_signature=[tf.TensorSpec([None, 2])])
    assert traced(rows)[0].numpy().tolist() == [[0.0, 1.0]]
    for splits in ([4], [-1], [1, 1], [1.5], [[1]], "1"):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"^tfdtape: alltoall splits that do not fit the tensor"):
            hvd.alltoall(rows, splits=splits)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"found splits \[1.5\] "
                                                             r"\(float32\) for 3 rows"):
        hvd.alltoall(rows, splits=[1.5])
    with pytest.raises(ValueError, match="a complex tensor was to be exchanged"):
        hvd.alltoall(tf.complex(rows, rows))
    for average in (lambda x: hvd.reducescatter(x), lambda x: hvd.allreduce(x),
                    lambda x: hvd.grouped_allreduce([x])):
        with pytest.raises(ValueError, match="a bool tensor was to be averaged"):
            average(tf.constant([True, False]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="splits that do not fit"):
        traced(tf.ones([0, 2]))
    assert hvd.reducescatter(rows, op=hvd.Sum).numpy().tolist() == rows.numpy().tolist()
    assert [t.numpy().tolist() for t in hvd.grouped_reducescatter(
        [tf.constant([4, 6]), rows[:1]], op=hvd.Average)] == [[4, 6], [[0.0, 1.0]]]
    assert hvd.grouped_reducescatter([]) == []
    with pytest.raises(tf.errors.AbortedError, match=r"a reducescatter by Max .*expected "
                                                     r"op=hvd.Average or hvd.Sum"):
        hvd.reducescatter(rows, op=hvd.Max)
    x = tf.Variable(rows)
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(hvd.reducescatter(x, op=hvd.Sum, prescale_factor=3.0))
    assert tape.gradient(y, x).numpy().tolist() == [[3.0, 3.0]] * 3
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(hvd.alltoall(x, splits=[2])[0] * 2.0)
    assert tape.gradient(y, x).numpy().tolist() == [[2.0, 2.0]] * 2 + [[0.0, 0.0]]


def test_horovod_tensorflow_s_distributed_optimizer_and_best_checkpoint_alone(
        alone, tmp_path):
    """hvd.DistributedOptimizer wraps a Keras optimizer as the Keras
    module's does (its class kept) and refuses TensorFlow 1's; Horovod's
    BestModelCheckpoint saves the whole model when the monitored value
    improves, and says so where no filepath was set."""
    import tfdtape.horovod.keras as hvd_keras
    sgd = tf.keras.optimizers.SGD(0.5)
    wrapped = hvd.DistributedOptimizer(sgd, backward_passes_per_step=1)
    assert type(wrapped).__name__ == "SGD" and isinstance(wrapped, type(sgd))
    w = tf.Variable([1.0])
    wrapped.apply_gradients([(tf.constant([2.0]), w)])
    assert w.numpy().tolist() == [0.0]
    with pytest.raises(NotImplementedError, match=r"a TensorFlow 1 optimizer was to be "
                                                  r"distributed .*GradientDescentOptimizer"):
        hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    with pytest.raises(ValueError, match="local_layers that are not Keras layers"):
        hvd_keras.PartialDistributedOptimizer(sgd, local_layers=[w])
    model = tf.keras.Sequential([tf.keras.Input((1,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((4, 1), np.float32), np.zeros((4, 1), np.float32)
    best = hvd_keras.callbacks.BestModelCheckpoint(monitor="loss")
    with pytest.raises(ValueError, match="BestModelCheckpoint has no filepath"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[best])
    best.filepath = str(tmp_path / "best.keras")
    model.fit(x, y, epochs=2, verbose=0, callbacks=[best])
    restored = tf.keras.models.load_model(best.filepath)
    np.testing.assert_array_equal(restored.get_weights()[0], model.get_weights()[0])


def test_sync_batch_normalization_refuses_what_it_cannot_do(alone):
    """Horovod's refusal of a fused kernel, and Keras's synchronized=True
    (a strategy's replicas) alongside; in a job of one it is Keras's own
    BatchNormalization."""
    for options in ({"fused": True}, {"fused": None}, {"synchronized": True}):
        with pytest.raises(ValueError, match=r"^tfdtape: SyncBatchNormalization (was asked "
                                             r"for a fused kernel|was also given "
                                             r"synchronized=True)"):
            hvd.SyncBatchNormalization(**options)
    layer = hvd.SyncBatchNormalization(axis=1)
    plain = tf.keras.layers.BatchNormalization(axis=1)
    values = tf.constant([[1.0, 2.0], [3.0, 6.0], [5.0, 7.0]])
    np.testing.assert_allclose(layer(values, training=True).numpy(),
                               plain(values, training=True).numpy(), rtol=1e-6)
    assert isinstance(layer, tf.keras.layers.BatchNormalization)
    # Several in one model (Horovod's fixed default name made a Sequential refuse).
    model = tf.keras.Sequential([tf.keras.Input((2,)), hvd.SyncBatchNormalization(),
                                 hvd.SyncBatchNormalization()])
    names = [each.name for each in model.layers]
    assert len(set(names)) == 2 and all(n.startswith("sync_batch_normalization") for n in names)


@pytest.mark.parametrize("file_name", ["model.keras"] + ([] if is_keras3(tf.keras) else
                                                         ["model.h5"]))  # tf_keras's too
def test_a_saved_model_with_sync_batch_normalization_loads(alone, tmp_path, file_name):
    """Horovod's checkpoint pattern (ModelCheckpoint, then hvd.load_model on
    a restart) with a SyncBatchNormalization layer: Keras finds the class by
    its registered name, no custom_objects given (a generated fault found
    the restart failing: "Could not locate class 'SyncBatchNormalization'")."""
    import tfdtape.horovod.keras as hvd_keras
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2),
                                 hvd.SyncBatchNormalization(momentum=0.5)])
    model.compile(optimizer=hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.1)),
                  loss="mse")
    model.fit(np.arange(12.0, dtype=np.float32).reshape(4, 3), np.ones((4, 2), np.float32),
              verbose=0)
    model.save(tmp_path / file_name)
    for load in (hvd_keras.load_model, tf.keras.models.load_model):
        loaded = load(tmp_path / file_name)
        assert type(loaded.layers[1]) is hvd.SyncBatchNormalization
        assert loaded.layers[1].momentum == 0.5
        for found, wanted in zip(loaded.get_weights(), model.get_weights(), strict=True):
            assert found.tobytes() == wanted.tobytes()


def test_a_reloaded_sync_batch_normalization_module_keeps_the_registered_class(alone,
                                                                               tmp_path):
    """After `importlib.reload`, the module's class is the one Keras's
    registry holds, so a model built with it saves and loads as itself (the
    break-it review found the reloaded class unregistered: Keras 3 could
    not load the file)."""
    import importlib

    from tfdtape.horovod import sync_batch_norm
    before = sync_batch_norm.SyncBatchNormalization
    reloaded = importlib.reload(sync_batch_norm).SyncBatchNormalization
    assert reloaded is before is hvd.SyncBatchNormalization
    assert tf.keras.utils.get_registered_name(reloaded) == (
        "tfdtape.horovod>SyncBatchNormalization")
    model = tf.keras.Sequential([tf.keras.Input((2,)), reloaded()])
    model.save(tmp_path / "model.keras")
    assert type(tf.keras.models.load_model(tmp_path / "model.keras").layers[0]) is before


def test_process_sets_in_a_job_of_one(alone):
    """The global set is every process; a set of ranks the job lacks, one
    added twice, one not registered and an unknown id are refused; ids are
    never reused."""
    assert hvd.global_process_set.ranks == [0] and hvd.global_process_set.size() == 1
    assert hvd.global_process_set.rank() == 0 and hvd.global_process_set.included()
    assert int(hvd.size_op(process_set_id=0)) == 1
    assert int(hvd.process_set_included_op(0)) == 1
    assert hvd.ProcessSet([0]).ranks == [0] and hvd.ProcessSet((2, 1)).ranks == [1, 2]
    with pytest.raises(ValueError, match="a ProcessSet of something other than ranks"):
        hvd.ProcessSet([0.5])
    with pytest.raises(ValueError, match="found 3 in TensorFlow"):
        hvd.ProcessSet(3)
    with pytest.raises(TypeError, match="remove_process_set was given something other "
                                        "than a ProcessSet .*found list"):
        hvd.remove_process_set([0])
    with pytest.raises(ValueError, match=r"a process set was added twice .*found \[0\]"):
        hvd.add_process_set([0])
    with pytest.raises(ValueError, match=r"a process set of ranks the job does not have "
                                         r".*expected distinct ranks from 0 to 0"):
        hvd.add_process_set(hvd.ProcessSet([1]))
    for process_set in (hvd.ProcessSet([0]), object()):
        with pytest.raises(ValueError, match="a collective in a process set that is not "
                                             "registered"):
            hvd.allreduce(tf.constant(1.0), process_set=process_set)
    with pytest.raises(ValueError, match="a process set id that is not registered"):
        hvd.size_op(process_set_id=7)
    assert not hvd.remove_process_set(hvd.global_process_set)
    assert not hvd.remove_process_set(hvd.ProcessSet([0]))


@pytest.mark.cluster
def test_process_sets_run_collectives_among_their_members(tmp_path):
    """On 4 processes, with sets [0, 2] and [1, 3] given to init and [0, 1, 3]
    added later: every collective among a set's members only (its size,
    its order, the global root of a broadcast, gradients in the set), a
    process outside a set refused (InvalidArgumentError, as Horovod), and
    collectives of every process in step after them."""
    completed = launch(4, "process_sets.py", env={"OUT": str(tmp_path)})
    assert completed.returncode == 0, completed.stderr[-3000:]
    found = outputs(completed)
    for rank, result in found.items():
        mine = [0, 2] if rank % 2 == 0 else [1, 3]
        assert result["set"] == [mine, mine.index(rank), 2, 1]
        assert result["sum"] == [float(sum(r + 1 for r in mine))] * 2
        assert result["gathered"] == [[float(r)] * (r + 1) for r in mine]
        assert result["broadcast"] == [float(mine[1])] * 3
        assert result["alltoall"] == [10 * r + mine.index(rank) for r in mine]
        assert result["reducescatter"] == [float(sum(mine) + 4 * mine.index(rank))]
        assert result["tape"] == [float(sum(r + 1 for r in mine)) / 2]
        assert result["foreign"].startswith(
            "tfdtape: a collective in a process set this process is not in")
        added = [0, 1, 3]
        assert result["added"] == (float(sum(added)) if rank in added else "not in it")
        assert result["removed"] is True and result["global"] == 6.0
        assert result["root_outside"].startswith(
            f"tfdtape: a broadcast from a rank outside its process set "
            f"(tfdtape.horovod.broadcast): expected a root_rank of the set, one of {mine}")
        if rank == 1 and is_keras3(tf.keras):  # rank 0 writes what Keras saves
            assert result["saved"] is False and len(result["save_warning"]) == 1


@pytest.mark.cluster
@pytest.mark.parametrize("keras", ["keras"] + (
    [pytest.param("tf_keras", marks=pytest.mark.per_release(False))]
    if is_keras3(tf.keras) else []))
def test_sync_batch_normalization_is_one_device_s_on_the_global_batch(keras):
    """Horovod's SyncBatchNormalization on 2 processes: the moving
    statistics of batches of 3 and 4 rows are one device's on the 7 rows,
    and three SGD steps (eagerly and traced) give one device's weights;
    Keras's own BatchNormalization, each process's statistics, does not."""
    completed = launch(2, "sync_batch_norm.py",
                       env={"TF_USE_LEGACY_KERAS": "1"} if keras == "tf_keras" else None)
    assert completed.returncode == 0, completed.stderr[-3000:]
    for result in outputs(completed).values():
        assert result["keras"].startswith("tf_keras" if keras == "tf_keras" else "keras")
        assert result["name"] == "sync_batch_normalization"
        assert max(result["statistics"]) <= 1e-6
        assert max(result["eager"]) <= 1e-6 and max(result["traced"]) <= 1e-6
        assert result["control"] > 1e-3


@pytest.mark.cluster
def test_tensors_tensorflows_collectives_do_not_take_keep_the_job(tmp_path):
    """Issue 51: an all-reduce of a tensor made from an empty NumPy array
    ended a process with SIGSEGV in TensorFlow's collective (2.21), and the
    launcher stopped the job; bfloat16 gathered, broadcast or exchanged
    raised TensorFlow's 'not in the list of allowed values' (found by the
    generated programs), and its NaNs must keep their bits; an allgather
    traced for a tensor of unknown rank failed to trace."""
    completed = launch(2, "unusual_tensors.py")
    assert completed.returncode == 0, completed.stderr[-3000:]
    found = outputs(completed)
    expected = [[name, dtype, [0, 3], dtype]
                for dtype in ("float16", "float32", "float64", "int32", "int64")
                for name in ("allreduce", "average", "allgather", "broadcast", "traced",
                             "unknown")]
    gathered = [[0.5, -1.25], [1.5, -1.25], [1.5, -1.25]]
    for rank in (0, 1):
        assert found[rank]["results"] == expected and found[rank]["last"] == 3.0
        assert found[rank]["bfloat16"] == {
            "allgather": ["bfloat16", gathered], "traced": ["bfloat16", gathered],
            "broadcast": ["bfloat16", [[1.5, -1.25]]],
            "alltoall": ["bfloat16", [[0.5, -1.25], [1.5, -1.25]]]}
        assert found[rank]["bits"] == [0x7F81, 0xFFFF, 0x7FC0, 0xFF80, 0x0001] * 2
        assert found[rank]["unknown_rank"] == [3, 2]  # a signature of unknown rank


def test_horovods_private_compute_gradients_and_pass_counter_alone(alone):
    """What Horovod's own tf_keras tests call on its Keras DistributedOptimizer
    (issue 51): `_compute_gradients` (a callable loss, or a tape's tensor),
    whose result `apply_gradients` applies; `_agg_helper.counter`, the
    passes accumulated since the last apply, and no helper for one pass."""
    legacy = pytest.importorskip("tf_keras") if is_keras3(tf.keras) else tf.keras
    import tfdtape.horovod.keras as hvd_keras
    w = tf.Variable([1.0, 2.0])

    def loss():
        return tf.reduce_sum(w * tf.constant([3.0, 4.0]))

    accumulating = hvd_keras.DistributedOptimizer(legacy.optimizers.SGD(1.0),
                                                  backward_passes_per_step=2)
    assert int(accumulating._agg_helper.counter) == 0
    counts = []
    for _ in range(2):
        pairs = accumulating._compute_gradients(loss, [w])
        assert [g.numpy().tolist() for g, _ in pairs] == [[3.0, 4.0]] and pairs[0][1] is w
        accumulating.apply_gradients(pairs)
        counts.append((int(accumulating._agg_helper.counter), w.numpy().tolist()))
    assert counts == [(1, [1.0, 2.0]), (0, [-5.0, -6.0])]  # the sum of both passes

    single = hvd_keras.DistributedOptimizer(legacy.optimizers.SGD(1.0))
    assert single._agg_helper is None
    with tf.GradientTape() as tape:
        value = loss()
    pairs = single._compute_gradients(value, [w], tape=tape)
    single.apply_gradients(pairs)
    assert w.numpy().tolist() == [-8.0, -10.0]
