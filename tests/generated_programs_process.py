"""Runs generated programs in one device layout: one JSON line per program.

    python tests/generated_programs_process.py --devices N --seed S --cases K
    python tests/generated_programs_process.py --devices N --program SPEC

Each program (`generated_programs.Program`) runs on stock TensorFlow, with
tfdtape, and with tfdtape alone (TensorFlow's native resolver off), each
time on fresh variables, and is classified against the oracle. The process
splits the CPU into N virtual devices before TensorFlow starts; MirroredStrategy
spans all N. Printed per program: its spec, the oracle's answer, the three
results and the outcome. `--shrink` also prints, for each failing program,
the one closest to `SIMPLEST` that still fails.
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
from tfdtape import testing

KERAS3 = not issubclass(getattr(tf.keras, "Variable", tf.Variable), tf.Variable)
CONFIGURATIONS = {"stock": testing.stock, "tfdtape": testing.with_tfdtape,
                  "alone": testing.tfdtape_alone}


class Layout:
    """The process's devices and its strategies, built once."""

    def __init__(self, devices):
        self.devices = devices
        self._strategies = {}

    def strategy(self, name, reduction="default"):
        """The strategy `name`; a MirroredStrategy's cross-device ops by
        `reduction` (its default, or HierarchicalCopyAllReduce)."""
        key = (name, reduction)
        if key not in self._strategies:
            cross_device_ops = (tf.distribute.HierarchicalCopyAllReduce()
                                if reduction == "hierarchical_copy" else None)
            self._strategies[key] = {
                "none": tf.distribute.get_strategy,
                "one_device": lambda: tf.distribute.OneDeviceStrategy(self.devices[0]),
                "mirrored": lambda: tf.distribute.MirroredStrategy(
                    self.devices, cross_device_ops=cross_device_ops),
            }[name]()
        return self._strategies[key]

    def other_strategy(self):
        """A strategy no program makes its variables in: a OneDeviceStrategy
        on the last device."""
        if "other" not in self._strategies:
            self._strategies["other"] = tf.distribute.OneDeviceStrategy(
                self.devices[-1])
        return self._strategies["other"]


def make_variable(program, strategy):
    """A fresh variable of the program's kind, and the function giving the
    value a replica computes from its input x: x * v (with a gather read, v
    is the first element of a vector of two, read by tf.gather)."""
    kind = program.variable
    scope = (contextlib.nullcontext() if program.strategy == "none"
             else strategy.scope())
    initial = gp.VALUE if program.read == "dense" else [gp.VALUE, gp.VALUE]

    def reader(variable):
        if program.read == "dense":
            return lambda x: x * variable
        return lambda x: x * tf.gather(variable, [0])[0]

    if kind == "plain":
        variable = tf.Variable(initial)
        return variable, reader(variable)
    with scope:
        if kind == "mirrored":
            variable = tf.Variable(initial)
        elif kind == "in_function":
            made = []

            @tf.function
            def create():
                if not made:
                    made.append(tf.Variable(initial))
                return made[0].read_value()

            create()
            variable = made[0]
        elif kind == "keras_dense":
            layer = tf.keras.layers.Dense(
                1, use_bias=False,
                kernel_initializer=tf.keras.initializers.Constant(gp.VALUE))
            layer.build((None, 1))
            return layer.kernel, lambda x: layer(tf.reshape(x, (1, 1)))[0, 0]
        else:
            aggregation = (tf.VariableAggregation.SUM if kind == "on_read_sum"
                           else tf.VariableAggregation.MEAN)
            variable = tf.Variable(
                initial, trainable=True, aggregation=aggregation,
                synchronization=tf.VariableSynchronization.ON_READ)
    return variable, reader(variable)


def plain(value, strategy):
    """A result as plain Python: floats, lists, None."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return [plain(item, strategy) for item in value]
    if isinstance(value, tf.distribute.DistributedValues):
        return [plain(item, strategy)
                for item in strategy.experimental_local_results(value)]
    array = np.asarray(tf.convert_to_tensor(value))
    return float(array.reshape(())) if array.size == 1 else array.tolist()


def weights(variable):
    """The variable's value after a step: one value when its components
    agree, else every component's (replicas drifting apart)."""
    inner = variable if isinstance(variable, tf.Variable) else variable.value
    components = getattr(inner, "values", (inner,))
    found = [plain(c.read_value(), None) for c in components]
    return found[0] if all(f == found[0] for f in found) else found


class Build:
    """One program's pieces, built fresh in the current configuration."""

    def __init__(self, program, layout):
        self.p = program
        self.layout = layout
        self.strategy = layout.strategy(program.strategy, program.reduction)
        self.w, self.value = make_variable(program, self.strategy)
        self.unused = (make_variable(program, self.strategy)[0]
                       if program.unconnected != "none" else None)
        self.inputs = self.strategy.experimental_distribute_values_from_function(
            lambda context: tf.constant(float(context.replica_id_in_sync_group + 1)))
        self.optimizer = None
        if program.step == "sgd":
            with self.scope():
                self.optimizer = tf.keras.optimizers.SGD(gp.LEARNING_RATE)
                self.optimizer.build([self.w])
        self.recording_tape = None  # For a watch inside the replicas.

    def scope(self):
        if self.p.strategy == "none":
            return contextlib.nullcontext()
        return self.strategy.scope()

    def scope_if(self, condition):
        return self.scope() if condition else contextlib.nullcontext()

    def apply(self, gradient):
        """The optimizer step where the program applies (`apply`): in the
        open scope, outside every scope, or in another strategy's."""
        apply_where = self.p.apply
        scope = (self.layout.other_strategy().scope() if apply_where == "other_scope"
                 else contextlib.nullcontext())
        with scope:
            # Keras 2 aggregates through merge_call unless told not to, which
            # fails outside replica context (docs/semantics.md: a total needs
            # none).
            options = ({} if KERAS3 or not tf.distribute.in_cross_replica_context()
                       else {"skip_gradients_aggregation": True})
            self.optimizer.apply_gradients([(gradient, self.w)], **options)

    def tape(self):
        return tf.GradientTape(persistent=self.p.persistent,
                               watch_accessed_variables=self.p.watch == "auto")

    def sources(self):
        return self.w if self.unused is None else [self.w, self.unused]

    def unconnected(self):
        return (tf.UnconnectedGradients.ZERO if self.p.unconnected == "zero_extra"
                else tf.UnconnectedGradients.NONE)

    def first(self, gradient):
        return gradient if self.unused is None else gradient[0]

    def extra(self):
        with tf.device(self.layout.devices[-1]):
            return gp.EXTRA * self.value(1.0)

    # Tapes outside the replicas -------------------------------------------

    def replica_fn(self, x):
        if self.p.watch == "explicit_inside":
            self.recording_tape.watch(self.w)
        z = self.value(x)
        return z * self.across(z)

    def across(self, z):
        """What the replica multiplies z by: z, or a collective of every
        replica's z (`generated_programs.DIMENSIONS`' `collective`)."""
        collective = self.p.collective
        if collective == "none":
            return z
        context = tf.distribute.get_replica_context()
        if collective == "all_reduce_sum":
            return context.all_reduce("SUM", z)
        if collective == "all_reduce_mean":
            return context.all_reduce("MEAN", z)
        gathered = context.all_gather(tf.reshape(z, (1,)), axis=0)
        inputs = tf.range(1.0, tf.cast(tf.shape(gathered)[0], tf.float32) + 1.0)
        return tf.reduce_sum(gathered * inputs)

    def combined(self):
        replica_fn = (tf.function(self.replica_fn)
                      if self.p.control == "traced_replica_fn" else self.replica_fn)
        per_replica = self.strategy.run(replica_fn, args=(self.inputs,))
        target = self.p.target
        if target == "reduce_sum":
            return self.strategy.reduce("SUM", per_replica, axis=None)
        if target == "reduce_mean":
            return self.strategy.reduce("MEAN", per_replica, axis=None)
        if target == "local_sum":
            return tf.add_n(self.strategy.experimental_local_results(per_replica))
        return per_replica

    def replicas_target(self):
        control = self.p.control
        if control in ("straight", "traced_replica_fn"):
            return self.combined()
        if control == "cond":
            return tf.cond(tf.constant(True), self.combined, lambda: 0.0)
        _, total = tf.while_loop(lambda i, t: i < 1,
                                 lambda i, t: (i + 1, t + self.combined()),
                                 (tf.constant(0), tf.constant(0.0)))
        return total

    def record(self):
        if self.p.tape == "direct":
            z = self.value(1.0)
            target = z * z
        else:
            target = self.replicas_target()
        if self.p.extra_read:
            extra = self.extra()
            target = [target, extra] if self.p.target == "per_replica" else target + extra
        return target

    def differentiate(self, record):
        """The program's tape work around `record`; a dict of results."""
        p = self.p
        outer = self.tape() if p.nested else None
        with outer if outer is not None else contextlib.nullcontext():
            if outer is not None and p.watch != "auto":
                outer.watch(self.w)
            with self.scope_if(p.scope == "recording"):
                tape = self.tape()
                self.recording_tape = tape
                with tape:
                    if p.watch == "explicit_before":
                        tape.watch(self.w)
                    target = record()
            results = {"gradient": tape.gradient(
                target, self.sources(), unconnected_gradients=self.unconnected())}
            if p.persistent:
                results["gradient_again"] = tape.gradient(
                    target, self.sources(), unconnected_gradients=self.unconnected())
        if outer is not None:
            results["second_order"] = outer.gradient(
                self.first(results["gradient"]), self.w)
        if self.optimizer is not None and self.p.apply == "where_taken":
            self.apply(self.first(results["gradient"]))
        return results

    def run_outside(self):
        p = self.p
        if p.tape == "in_function":
            step = tf.function(lambda: self.differentiate(self.record))
            with self.scope_if(p.scope == "everything"):
                results = step()
        else:
            record = (tf.function(self.record) if p.tape == "around_function"
                      else self.record)
            with self.scope_if(p.scope == "everything"):
                results = self.differentiate(record)
        if self.optimizer is not None and p.apply != "where_taken":
            self.apply(self.first(results["gradient"]))
        return self.finish(results)

    # Tapes inside the replicas --------------------------------------------

    def in_replica(self, x):
        p = self.p
        outer = self.tape() if p.nested else None
        with outer if outer is not None else contextlib.nullcontext():
            if outer is not None and p.watch != "auto":
                outer.watch(self.w)
            tape = self.tape()
            with tape:
                if p.watch != "auto":
                    tape.watch(self.w)
                z = self.value(x)
                target = z * self.across(z)
                if p.extra_read:
                    target += self.extra()
            results = {"gradient": tape.gradient(
                target, self.sources(), unconnected_gradients=self.unconnected())}
            if p.persistent:
                results["gradient_again"] = tape.gradient(
                    target, self.sources(), unconnected_gradients=self.unconnected())
        if outer is not None:
            results["second_order"] = outer.gradient(
                self.first(results["gradient"]), self.w)
        if self.optimizer is not None and p.apply == "where_taken":
            self.optimizer.apply_gradients([(self.first(results["gradient"]), self.w)])
        return results

    def run_in_replica(self):
        def run():
            return self.strategy.run(self.in_replica, args=(self.inputs,))

        if self.p.tape == "in_replica_traced":
            run = tf.function(run)
        with self.scope_if(self.p.scope != "none"):
            results = run()
        if self.optimizer is not None and self.p.apply != "where_taken":
            self.apply(self.first(results["gradient"]))
        # Per replica: [replica 0's, replica 1's, ...] for each result.
        replicas = range(self.strategy.num_replicas_in_sync)
        return self.finish({key: [self.replica_part(value, r) for r in replicas]
                            for key, value in results.items()})

    def replica_part(self, structure, replica):
        """Replica `replica`'s part of a result of strategy.run (a value
        every replica returned alike, such as None, stays itself)."""
        return tf.nest.map_structure(
            lambda value: (self.strategy.experimental_local_results(value)[replica]
                           if isinstance(value, tf.distribute.DistributedValues)
                           else value), structure)

    def finish(self, results):
        found = {key: plain(value, self.strategy) for key, value in results.items()}
        if self.optimizer is not None:
            found["weights"] = weights(self.w)
        return found


def run(program, layout):
    """`program`'s results in the current configuration, or its error."""
    try:
        build = Build(program, layout)
        if program.in_replica:
            return build.run_in_replica()
        return build.run_outside()
    except Exception as error:
        return gp.describe(error)


def run_one(program, layout):
    """One program in the three configurations, with its oracle and outcome."""
    expected = gp.oracle(program, len(layout.devices))
    found = {}
    for name, configuration in CONFIGURATIONS.items():
        with configuration():
            found[name] = run(program, layout)
    outcome = gp.classify(expected, found["stock"], found["tfdtape"], found["alone"])
    return {"program": json.loads(program.spec()), "expected": expected,
            "found": found, "outcome": outcome}


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", type=int, default=0)
    parser.add_argument("--program", action="append", default=[],
                        help="a program's spec (JSON); may repeat")
    parser.add_argument("--shrink", action="store_true")
    arguments = parser.parse_args(argv)
    tf.get_logger().setLevel("ERROR")
    layout = Layout(testing.virtual_cpus(arguments.devices))
    programs = [gp.Program.from_spec(spec) for spec in arguments.program]
    programs += gp.generate(arguments.seed, arguments.cases)
    for program in programs:
        record = run_one(program, layout)
        if arguments.shrink and record["outcome"] not in gp.PASSING:
            record["shrunk"] = json.loads(gp.shrink(
                program, lambda candidate: run_one(candidate, layout)["outcome"]
                not in gp.PASSING).spec())
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
