"""Runs generated Keras training programs: one JSON line per program.

    python tests/generated_training_process.py --devices N --seed S --cases K
    python tests/generated_training_process.py --devices N --program SPEC

Each program (`generated_training.TrainingProgram`) trains a fresh model on
stock TensorFlow, with tfdtape, and with tfdtape alone (TensorFlow's native
resolver off), and is classified against the oracle as
`generated_programs.classify` does. The process splits the CPU into N
virtual devices before TensorFlow starts; MirroredStrategy spans all N.
With TF_CONFIG set the process is one worker of a MultiWorkerMirroredStrategy
cluster (one device each), runs the programs drawn for that strategy (with
tfdtape first, then on stock, whose workers may disagree and break the
cluster's collectives for what follows) and prints every record in one JSON
list at the end; the test compares the workers'. `--shrink` also prints, for
each failing program (not in a cluster), the one closest to `SIMPLEST`
that still fails.
"""

import argparse
import contextlib
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ["TFDTAPE_AUTOINSTALL"] = "0"

import numpy as np
import tensorflow as tf

import generated_programs as gp
import generated_training as gt
from generated_programs_process import CONFIGURATIONS
from keras_models import copies
from keras_models import is_keras3
from tfdtape import testing

KERAS3 = is_keras3(tf.keras)


class Strategies:
    """The process's strategies, each built once: none (the default
    strategy), MirroredStrategy over `devices`, or the cluster's
    MultiWorkerMirroredStrategy."""

    def __init__(self, devices):
        self._devices = devices
        self._made = {}

    def __getitem__(self, name):
        if name not in self._made:
            self._made[name] = {
                "none": tf.distribute.get_strategy,
                "mirrored": lambda: tf.distribute.MirroredStrategy(self._devices),
                "multi_worker": tf.distribute.MultiWorkerMirroredStrategy,
            }[name]()
        return self._made[name]


def build(program):
    """A fresh Dense(1) model and its optimizer, built (under the caller's
    scope)."""
    keras = tf.keras
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(
        1, kernel_initializer=keras.initializers.Constant(gt.KERNEL),
        bias_initializer=keras.initializers.Constant(gt.BIAS))])
    options = {}
    if program.clipping != "none":
        options[program.clipping] = gt.CLIP[program.clipping]
    if program.accumulation:
        options["gradient_accumulation_steps"] = program.accumulation
    rate = gt.LEARNING_RATE[program.optimizer]
    optimizer = (keras.optimizers.SGD(rate, **options) if program.optimizer == "sgd" else
                 keras.optimizers.Adam(rate, beta_1=gt.BETA_1, beta_2=gt.BETA_2,
                                       epsilon=gt.EPSILON, **options))
    if program.loss_scale == "dynamic":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    optimizer.build(model.trainable_variables)
    return model, optimizer


def train(program, strategy):
    """The program's result: the kernel and bias (first copies), the
    iteration counter and whether every copy of every weight agrees."""
    with strategy.scope():
        model, optimizer = build(program)
        if program.loop == "fit":
            model.compile(optimizer=optimizer, loss="mse",
                          steps_per_execution=program.steps_per_execution)
    if program.loop == "fit":
        model.fit(gt.FEATURES, program.labels, batch_size=gt.GLOBAL_BATCH, epochs=1,
                  shuffle=False, verbose=0)
    else:
        step = make_step(program, strategy, model, optimizer)
        with strategy.scope() if program.scope == "inside" else contextlib.nullcontext():
            for index in range(gt.STEPS):
                step(*shares(program, strategy, index))
    weights = [copies(w) for w in model.trainable_variables]
    agree = all(np.array_equal(c, found[0]) for found in weights for c in found)
    return {"kernel": weights[0][0].ravel().tolist(), "bias": float(weights[1][0][0]),
            "iterations": int(np.asarray(optimizer.iterations)), "copies_agree": agree}


def shares(program, strategy, step):
    """Step `step`'s global batch as per-replica values: replica r (over
    every worker) holds the r-th contiguous share."""
    rows = slice(step * gt.GLOBAL_BATCH, (step + 1) * gt.GLOBAL_BATCH)
    features, labels = gt.FEATURES[rows], program.labels[rows]
    share = gt.GLOBAL_BATCH // strategy.num_replicas_in_sync

    def part(context):
        start = context.replica_id_in_sync_group * share
        return (tf.constant(features[start:start + share]),
                tf.constant(labels[start:start + share]))
    return strategy.experimental_distribute_values_from_function(part)


def make_step(program, strategy, model, optimizer):
    """The tutorial step (tape and apply inside strategy.run) or the
    spanning one (the tape around it, the apply after), traced or not."""
    variables = model.trainable_variables
    skip = {} if KERAS3 else {"skip_gradients_aggregation": True}

    def loss_of(x, y):  # the replica's part of the global batch's mean, scaled
        loss = tf.reduce_sum((model(x) - y) ** 2) / gt.GLOBAL_BATCH
        return optimizer.scale_loss(loss) if KERAS3 else loss

    def tutorial(x, y):
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = loss_of(x, y)
            optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        strategy.run(replica, args=(x, y))

    def spanning(x, y):
        with tf.GradientTape() as tape:
            loss = strategy.reduce("SUM", strategy.run(loss_of, args=(x, y)), axis=None)
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables), **skip)

    step = tutorial if program.loop.startswith("tutorial") else spanning
    return tf.function(step) if program.traced else step


def run(program, strategies):
    """`program`'s result in the current configuration, or its error."""
    try:
        return train(program, strategies[program.strategy])
    except Exception as error:
        return gp.describe(error)


def run_in(names, programs, strategies):
    """[{name: result}] of each program in the configurations `names`."""
    found = [{} for _ in programs]
    for name in names:
        for results, program in zip(found, programs):
            with CONFIGURATIONS[name]():
                results[name] = run(program, strategies)
    return found


def record(program, found, replicas):
    """A program's record: its oracle, its results and their outcome."""
    expected = gt.oracle(program, replicas, KERAS3)
    outcome = gp.classify(expected, found["stock"], found["tfdtape"], found["alone"],
                          same=gt.same)
    return {"program": json.loads(program.spec()), "keras3": KERAS3,
            "expected": expected, "found": found, "outcome": outcome}


def run_one(program, strategies, replicas):
    """One program in the three configurations, with its oracle and outcome."""
    return record(program, run_in(CONFIGURATIONS, [program], strategies)[0], replicas)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", type=int, default=0)
    parser.add_argument("--program", action="append", default=[],
                        help="a program's spec (JSON); may repeat")
    parser.add_argument("--shrink", action="store_true")
    arguments = parser.parse_args(argv)
    tf.get_logger().setLevel("ERROR")
    cluster = json.loads(os.environ["TF_CONFIG"])["cluster"] if "TF_CONFIG" in os.environ else None
    if cluster:  # the cluster's collectives are set up before the runtime starts
        strategies = Strategies(None)
        strategies["multi_worker"]
    else:
        strategies = Strategies(testing.virtual_cpus(arguments.devices))
    replicas = len(cluster["worker"]) if cluster else arguments.devices
    programs = [gt.TrainingProgram.from_spec(spec) for spec in arguments.program]
    programs += gt.generate(arguments.seed, arguments.cases, keras3=KERAS3, replicas=replicas,
                            strategies=("multi_worker",) if cluster else ("mirrored", "none"))
    if cluster:
        # Stock last: a stock program whose workers disagree (one applies,
        # another skips) breaks the cluster's collectives for what follows.
        found = run_in(("tfdtape", "alone"), programs, strategies)
        for results, stock in zip(found, run_in(("stock",), programs, strategies)):
            results.update(stock)
        print(json.dumps([record(program, results, replicas)
                          for program, results in zip(programs, found)]))
        return
    for program in programs:
        found = run_one(program, strategies, replicas)
        if arguments.shrink and found["outcome"] not in gp.PASSING:
            found["shrunk"] = json.loads(gt.shrink(
                program, lambda candidate: run_one(candidate, strategies, replicas)[
                    "outcome"] not in gp.PASSING, KERAS3, replicas).spec())
        print(json.dumps(found), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
