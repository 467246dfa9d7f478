"""The spanning loop across workers: MultiWorkerMirroredStrategy with 2 and
3 worker processes on loopback (one replica each), every worker killed and
the test failed past a hard time limit.

Each worker trains the cases of `worker_training` for 3 steps in the same
order (multi_worker_spanning_process.py). After them the weights must equal
one device's on the global batch (rtol 1e-5) and be bitwise identical on
every worker; what must be refused must raise the same error on every
worker. The control runs the same programs on stock TensorFlow, and its
result is stated per case: in scope the handle error at tape.gradient, with
no scope a None gradient for every variable (Keras then refuses the apply);
the tutorial loop (tape inside strategy.run) is bitwise the same with
tfdtape and on stock.
"""

import importlib.util
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import loopback
import releases
import worker_training as wt
from keras_models import is_keras3
from tfdtape.cli import run_report

pytestmark = [pytest.mark.per_release, pytest.mark.cluster]

PROCESS = str(loopback.TESTS / "multi_worker_spanning_process.py")
TIME_LIMIT = 600


def case(**choices):
    return dict({"loop": "spanning", "mode": "eager", "optimizer": "sgd",
                 "scope": True, "target": "sum"}, **choices)


TRAINING = [case(mode=mode, optimizer=optimizer, scope=scope, target=target)
            for mode in ("eager", "tf_function")
            for optimizer in ("sgd", "adam")
            for scope in (True, False)
            for target in ("sum", "mean", "local_sum")
            if optimizer == "sgd" or target == "sum"]
TRAINING += [case(mode=mode, l2=True) for mode in ("eager", "tf_function")]
TRAINING += [case(mode=mode, spare=True, transform="clip")
             for mode in ("eager", "tf_function")]
TRAINING += [case(mode=mode, target=target) for mode in ("eager", "tf_function")
             for target in ("sum_axis", "mean_axis")]
TRAINING += [case(mode=mode, model="embedding", optimizer=optimizer)
             for mode in ("eager", "tf_function") for optimizer in ("sgd", "adam")]
TRAINING += [case(mode=mode, spare=True, zeros=True) for mode in ("eager", "tf_function")]
TRAINING += [case(mode=mode, keras="tf_keras", skip=skip)
             for mode in ("eager", "tf_function") for skip in (True, False)
             if importlib.util.find_spec("tf_keras") is not None]
TUTORIAL = [case(loop="tutorial", mode=mode, optimizer=optimizer)
            for mode in ("eager", "tf_function") for optimizer in ("sgd", "adam")]
REFUSED = [case(mode=mode, **choices)
           for mode in ("eager", "tf_function")
           for choices in ({"l2": "varying"}, {"transform": "local_scale"},
                           {"nested": True}, {"l2": True, "scope": False})]
REFUSED += [case(spare=True, partly="outside")]
KERAS3 = is_keras3(tf.keras)
"""Keras 3 optimizers all-reduce through ReplicaContext.all_reduce, where a
total is refused; Keras 2's through a merge_call (not checked: README)."""
REFUSED += [case(mode=mode, apply="inside", optimizer=optimizer)
            for mode in ("eager", "tf_function") for optimizer in ("sgd", "adam")
            if KERAS3]
PARTLY = [case(spare=True, partly="inside", optimizer=optimizer)
          for optimizer in ("sgd", "adam")]
"""Eagerly, a term only worker 0 computes: inside the replicas it takes part
there alone (the others all-reduce zeros for it); outside them no one count
of it is the job's (refused on every worker)."""


def cluster_reports(workers, cases, stock=False, no_rows=False):
    """Each worker's report for `cases` (one fresh cluster), with the
    transfers of no rows where `no_rows`."""
    arguments = ([PROCESS, json.dumps(cases)] + (["--stock"] if stock else [])
                 + (["--no-rows"] if no_rows else []))
    reports = loopback.run_processes(
        loopback.worker_configs(workers), arguments, TIME_LIMIT,
        env={"TFDTAPE_AUTOINSTALL": "0"} if stock else None)
    assert [r["task"] for r in reports] == list(range(workers))
    assert {r["replicas"] for r in reports} == {workers}
    return reports


def run_cluster(workers, cases, stock=False):
    """Each worker's results for `cases` (one fresh cluster)."""
    return [r["results"] for r in cluster_reports(workers, cases, stock)]


def assert_trained_like_one_device(results, cases):
    """Every worker's weights equal one device's (rtol 1e-5) and each
    other's, bitwise."""
    for index, chosen in enumerate(cases):
        found = [worker[index] for worker in results]
        assert all("weights" in f for f in found), (chosen, found[0])
        assert all(f["bytes"] == found[0]["bytes"] for f in found), chosen
        expected = wt.one_device(chosen)
        for weight, want in zip(found[0]["weights"], expected):
            np.testing.assert_allclose(np.array(weight), want, rtol=1e-5, atol=1e-7,
                                       err_msg=json.dumps(chosen))
        moved = [not np.allclose(np.array(w), start) for w, start in
                 zip(found[0]["weights"], wt.one_device(dict(chosen, steps=0)))]
        trained = len(moved) - (2 if chosen.get("spare") else 0)
        assert moved[:trained] == [True] * trained, chosen


TWO_WORKER_CASES = TRAINING + TUTORIAL + REFUSED + PARTLY


@pytest.fixture(scope="module")
def two_workers_reports():
    """Each worker's report of TWO_WORKER_CASES on a 2-worker cluster with tfdtape."""
    return cluster_reports(2, TWO_WORKER_CASES, no_rows=True)


@pytest.fixture(scope="module")
def two_workers(two_workers_reports):
    """The cases on a 2-worker cluster with tfdtape: (results, cases)."""
    return [r["results"] for r in two_workers_reports], TWO_WORKER_CASES


def results_of(run, wanted):
    results, cases = run
    indices = [cases.index(chosen) for chosen in wanted]
    return [[worker[index] for index in indices] for worker in results]


def test_two_workers_train_like_one_device_on_the_global_batch(two_workers):
    assert_trained_like_one_device(results_of(two_workers, TRAINING), TRAINING)


def test_collectives_of_no_rows_give_numpys_result_on_every_worker(two_workers_reports):
    """Issue 51: on stock TensorFlow 2.21 each of these ends the process with
    SIGSEGV (tfdtape.empty_collectives; the in-process control is
    tests/test_empty_collectives.py's). Worker 0's batch of no rows beside
    worker 1's two rows gathers as NumPy concatenates them."""
    no_rows = [[0, 3], []]
    for report in two_workers_reports:
        device = f"/job:worker/replica:0/task:{report['task']}/device:CPU:0"
        assert report["no_rows"] == {
            "variable": no_rows, "variable_after": [[2], [1.0, 1.0]],  # the chief's
            "variable_device": device,
            "reduce": no_rows, "all_reduce": no_rows, "gather": no_rows,
            "gather_traced": no_rows, "gather_uneven": [[2, 3], [[2.0] * 3] * 2]}


STOCK_VARIABLE = """
import numpy as np, tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    tf.Variable(np.zeros((0, 3), np.float32))
print("created", flush=True)
"""


def test_stock_tensorflow_ends_the_chief_making_a_variable_of_no_elements():
    """The control of the variable above: TensorFlow as it ships broadcasts
    its initial value with its own collective ops (2.12 transfers it;
    releases.empty_collectives_end_the_process)."""
    crashes = releases.empty_collectives_end_the_process()
    if crashes is None:
        pytest.skip(f"stock TensorFlow {tf.__version__} was not measured on this broadcast")
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TFDTAPE_AUTOINSTALL="0")
    environment.pop("TF_CONFIG", None)
    completed = subprocess.run(
        [sys.executable, "-m", "tfdtape", "launch", "-np", "2", "--grace", "3",
         sys.executable, "-c", STOCK_VARIABLE],
        capture_output=True, text=True, env=environment, timeout=TIME_LIMIT)
    if crashes:
        assert "rank 0 exited with status 139" in completed.stderr, completed.stderr[-2000:]
        assert "[0]<stdout>:created" not in completed.stdout
    else:
        assert completed.returncode == 0, completed.stderr[-2000:]
        assert completed.stdout.count("<stdout>:created") == 2


def test_a_variable_the_loss_does_not_use_is_none_on_every_worker(two_workers):
    """None on every worker (zeros with unconnected_gradients=ZERO), and
    left as it was."""
    spare = [c for c in TRAINING if c.get("spare")]
    for worker in results_of(two_workers, spare):
        for chosen, found in zip(spare, worker):
            assert found["none_gradients"] == [False] * 4 + [not chosen.get("zeros")] * 2
            np.testing.assert_array_equal(found["weights"][4], np.full((3, 2), 0.25))


def test_a_variable_only_one_worker_uses_gets_the_same_gradient_everywhere(two_workers):
    """Worker 0 alone adds sum(spare kernel) inside its replica: every worker
    all-reduces the kernel (zeros from worker 1) and applies worker 0's
    gradient, the same bytes; the spare bias took part nowhere: None."""
    for worker in results_of(two_workers, PARTLY):
        for found in worker:
            assert found["none_gradients"] == [False] * 5 + [True]
    for chosen, found in zip(PARTLY, zip(*results_of(two_workers, PARTLY))):
        assert found[0]["bytes"] == found[1]["bytes"], chosen
        assert not np.allclose(found[0]["weights"][4], 0.25), chosen


def test_the_tutorial_loop_trains_like_one_device(two_workers):
    assert_trained_like_one_device(results_of(two_workers, TUTORIAL), TUTORIAL)


@pytest.mark.parametrize("choice, message", [
    ({"l2": "varying"}, "tfdtape: cannot count a term outside the replicas once for "),
    ({"transform": "local_scale"}, "tfdtape: cannot apply values that differ between "
     "workers (tf.__internal__.distribute.interim.maybe_merge_call)"),
    ({"nested": True}, "tfdtape: cannot take a gradient across workers while another "
     "tape records (MultiWorkerMirroredStrategy)"),
    # Eagerly 2x on 2 workers before the refusal; stock: the handle error.
    pytest.param({"apply": "inside"}, "tfdtape: cannot all-reduce a total over the "
                 "replicas again (tf.distribute.ReplicaContext.all_reduce)",
                 marks=pytest.mark.skipif(not KERAS3, reason="Keras 3's optimizers")),
    ({"l2": True, "scope": False}, "also read outside the replicas by a read outside "
     "any strategy.scope()"),
    # Keras 2.12 names a layer built on its own eagerly 'kernel:0'.
    ({"partly": "outside"}, re.compile(r"tfdtape: cannot count a term outside the "
                                       r"replicas once for '(spare/)?kernel:0'")),
])
def test_what_cannot_be_exact_is_refused_on_every_worker(two_workers, choice, message):
    wanted = [c for c in REFUSED if all(c.get(k) == v for k, v in choice.items())]
    for chosen, found in zip(wanted, zip(*results_of(two_workers, wanted))):
        assert len({json.dumps(f, sort_keys=True) for f in found}) == 1, found
        assert "error" in found[0], (chosen, found[0])
        pattern = message if isinstance(message, re.Pattern) else re.escape(message)
        assert re.search(pattern, found[0]["message"]), (chosen, found[0]["message"])


@pytest.mark.per_release(False)
def test_three_workers_train_like_one_device_on_the_global_batch():
    cases = [case(mode=mode, target=target, l2=target == "sum")
             for mode in ("eager", "tf_function") for target in ("sum", "mean")]
    cases += [case(mode="tf_function", optimizer="adam", scope=False)]
    assert_trained_like_one_device(run_cluster(3, cases), cases)


@pytest.mark.per_release(False)
def test_stock_tensorflow_cannot_run_the_spanning_loop_and_trains_the_tutorial_alike(
        two_workers):
    """The control: in scope, the handle error at tape.gradient; with no
    scope, None for every variable (Keras refuses to apply nothing); the
    tutorial loop the same bytes as with tfdtape."""
    spanning = [case(mode=mode, scope=scope) for mode in ("eager", "tf_function")
                for scope in (True, False)]
    tutorial = TUTORIAL
    stock = run_cluster(2, spanning + tutorial, stock=True)
    for worker in stock:
        for chosen, found in zip(spanning, worker):
            assert found.get("error") in ("ValueError", "StagingError"), (chosen, found)
            if chosen["scope"]:
                assert "handle is not available" in found["message"], found
            else:
                assert "No gradients provided for any variable" in found["message"], found
    with_tfdtape = results_of(two_workers, tutorial)
    for stock_worker, tfdtape_worker in zip(stock, with_tfdtape):
        for found, same in zip(stock_worker[len(spanning):], tfdtape_worker):
            assert found["bytes"] == same["bytes"]


@pytest.mark.per_release(False)
def test_tfdtape_run_on_each_worker_reports_its_totals_all_reduced(tmp_path):
    """`python -m tfdtape run --json report-{task}.json` on each worker: the
    totals counted per variable (in scope and without), all-reduced across
    both workers, said so in the summary."""
    pattern = str(tmp_path / "report-{task}.json")
    cases = [case(), case(mode="tf_function"), case(scope=False)]
    results = loopback.run_processes(
        loopback.worker_configs(2),
        ["-m", "tfdtape", "run", "--quiet", "--json", pattern, PROCESS,
         json.dumps(cases)], TIME_LIMIT)
    assert [r["task"] for r in results] == [0, 1]
    for index in range(2):
        report = json.loads((tmp_path / f"report-worker-{index}.json").read_text())
        assert report["task"] == f"worker-{index}" and report["exit_status"] == 0
        totals = report["total_derivatives"]
        # Keras 3 paths ("sequential_1/hidden/kernel") or Keras 2 names
        # ("hidden/kernel:0", "hidden/kernel:0 #2" for the next model's):
        # their last two parts.
        assert {("/".join(re.sub(r":0( #\d+)?$", "", t["source"]).split("/")[-2:]),
                 t["components"], t["workers"])
                for t in totals} == {(name, 1, 2) for name in (
                    "hidden/kernel", "hidden/bias", "out/kernel", "out/bias")}
        assert len(totals) == 12  # 4 variables of each case's model
        summary = " ".join(run_report.summary(report).split())
        assert "each the sum of 1 components, all-reduced across 2 workers" in summary


@pytest.mark.per_release(False)  # the spanning step per release: the tests above
def test_verify_checks_the_spanning_step_on_two_workers(tmp_path):
    """`verify --multi-worker --only spanning_step_two_workers`: PASS, with
    both tfdtape configurations observing the job's gradient applied alike
    and the stock and pre-seed workers raising the handle error."""
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    environment.pop("TF_CONFIG", None)
    report = tmp_path / "verify.json"
    completed = subprocess.run(
        [sys.executable, "-m", "tfdtape", "verify", "--multi-worker", "--only",
         "spanning_step_two_workers", "--json", str(report)],
        capture_output=True, text=True, env=environment, timeout=TIME_LIMIT)
    assert completed.returncode == 0, completed.stdout + completed.stderr[-2000:]
    # The check's line (a development build's "untested" note comes first).
    checks = [line.split()[:2] for line in completed.stdout.splitlines()
              if line.startswith("spanning_step_two_workers")]
    assert checks == [["spanning_step_two_workers", "PASS"]], completed.stdout
    observed = json.loads(report.read_text())["checks"][0]["observations"]
    assert observed["tfdtape"] == observed["tfdtape_alone"] == (
        "total over both workers, applied alike")
    for control in ("stock", "pre_seed"):
        assert observed[control].startswith("raised ValueError: "
                                            "DistributedVariable.handle"), observed
