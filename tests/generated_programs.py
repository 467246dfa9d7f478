"""Generated programs: small tape programs over many choices, an oracle that
knows nothing of tfdtape, and the classification of what a run gave.

A `Program` is one choice per dimension of `DIMENSIONS`: the strategy, the
kind of variable, where the tape is, which scope is open, how the variable is
watched, persistence, a second-order tape, the target, control flow around
`strategy.run`, an unconnected source, an extra read on another device, and
an optimizer step. `generate(seed, count)` draws valid programs from a
seeded random generator; `run(program, devices)` builds and runs one in the
current TensorFlow configuration and returns what it gave (values as plain
floats, or the exception); `oracle(program, replicas)` works the right
answer out in closed form, on one device's math: replica r's input is
x_r = r + 1 and its value (x_r v)², with v = 1.5 the variable's value (or,
for a gather read, its first element's, of a vector of two).

A plain seeded generator rather than Hypothesis: the programs run in one
subprocess per device layout, many per process, and the outcome counts per
seed are what CI and the closing notes compare; each program prints as one
line (`Program.spec`) that `run_one` replays, and `shrink` reduces a failure
to the fewest choices away from `SIMPLEST` that still fail, which is what
shrinking would give. The classification, the shrinking and the running of
a generator's process (`run_generator`, `outcome_summary`, `failures`) are
shared with the generated Keras training programs (`generated_training`).
"""

import collections
import dataclasses
import json
import os
import pathlib
import random
import re
import subprocess
import sys

import numpy as np

VALUE = 1.5
"""Every variable's initial value (each component's, for ON_READ ones)."""
EXTRA = 3.0
"""The factor of the extra read: target += EXTRA * v."""
LEARNING_RATE = 0.125

DIMENSIONS = {
    "strategy": ("none", "one_device", "mirrored"),
    "variable": ("plain", "mirrored", "in_function", "keras_dense",
                 "on_read_sum", "on_read_mean"),
    "tape": ("in_replica", "in_replica_traced", "around_run", "in_function",
             "around_function", "direct"),
    "scope": ("everything", "none", "recording"),
    "watch": ("auto", "explicit_before", "explicit_inside"),
    "persistent": (False, True),
    "nested": (False, True),
    "target": ("reduce_sum", "reduce_mean", "local_sum", "per_replica"),
    "control": ("straight", "cond", "loop", "traced_replica_fn"),
    "unconnected": ("none", "none_extra", "zero_extra"),
    "extra_read": (False, True),
    "step": ("gradient", "sgd"),
    "read": ("dense", "gather"),
    "reduction": ("default", "hierarchical_copy"),
    "collective": ("none", "all_reduce_sum", "all_reduce_mean", "all_gather"),
    "apply": ("where_taken", "no_scope", "other_scope"),
}
"""Each dimension's choices. `reduction`: MirroredStrategy's cross-device
ops, its default or HierarchicalCopyAllReduce (totals then go through
batch_reduce_to and a cross-replica apply gets a copy per device).
`collective`: what the replica function multiplies its z = x v by: z itself,
or across the replicas `ReplicaContext.all_reduce` of z (SUM or MEAN), or
the sum of `ReplicaContext.all_gather` of z weighted by the replicas'
inputs (each replica's slice counts (r + 1) times). `apply`: where the
optimizer step applies the gradient: where the tape took it (inside the
replicas for a tape there), or after, outside any strategy's scope, or in
another strategy's scope (a OneDeviceStrategy); a tape inside the replicas
then returns its per-replica gradient from strategy.run."""

SIMPLEST = {name: choices[0] for name, choices in DIMENSIONS.items()}
SIMPLEST.update(tape="around_run", variable="mirrored", strategy="mirrored")
"""The choices a failure is shrunk towards."""

OUTCOMES = ("right", "clear_error", "stock_fails_alike", "silent_wrong",
            "worse_than_stock", "unclear_error", "alone_differs")
"""How a program's run with tfdtape is classified: right; a clear error
(tfdtape's, documented); TensorFlow's own error, which stock raises alike;
and the failures."""
PASSING = ("right", "clear_error", "stock_fails_alike")

REFUSE = "refuse"
"""The oracle's answer where the program has no right value: only a clear
error is right."""


class Spec:
    """A frozen dataclass of choices that prints as one line of JSON."""

    def spec(self):
        """One line of JSON that `from_spec` reads back."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_spec(cls, text):
        return cls(**json.loads(text))


@dataclasses.dataclass(frozen=True)
class Program(Spec):
    strategy: str
    variable: str
    tape: str
    scope: str
    watch: str
    persistent: bool
    nested: bool
    target: str
    control: str
    unconnected: str
    extra_read: bool
    step: str
    read: str = "dense"
    reduction: str = "default"
    collective: str = "none"
    apply: str = "where_taken"

    @property
    def in_replica(self):
        return self.tape in ("in_replica", "in_replica_traced")


def pinned(program):
    """`program` with each choice that cannot apply to its other choices set
    to the one that stands for it: a tape without strategy.run around it
    (direct, or inside the replicas) has one target and no control flow, a
    watch inside the replicas is a watch before them where the tape does not
    reach into them, and the default strategy's scope is none."""
    p = program
    changes = {}
    if p.tape == "direct" or p.in_replica:
        changes.update(target="reduce_sum", control="straight")
    if p.tape == "direct":
        changes.update(collective="none")  # No replicas to communicate.
    if p.watch == "explicit_inside" and p.tape not in ("around_run", "in_function"):
        changes.update(watch="explicit_before")
    if p.strategy == "none":
        changes.update(scope="none")
    if p.strategy != "mirrored":
        changes.update(reduction="default")
    if p.target == "per_replica" and p.control in ("cond", "loop"):
        changes.update(control="straight")  # Control flow returns a reduced target.
    if p.step != "sgd":
        changes.update(apply="where_taken")  # Nothing is applied.
    return dataclasses.replace(p, **changes)


def valid(program):
    """Whether `program`'s choices make a program: pinned (`pinned`), and none
    of the combinations that cannot be built."""
    p = program
    if pinned(p) != p:
        return False
    if p.variable.startswith("on_read") and p.strategy != "mirrored":
        return False  # Outside MirroredStrategy they are plain variables.
    if p.variable.startswith("on_read") and p.step == "sgd":
        return False
    if p.nested and (p.step == "sgd" or p.read == "gather"):
        return False  # A second order of an IndexedSlices gradient: none.
    if p.read == "gather" and p.variable == "keras_dense":
        return False  # A Dense layer reads its kernel whole.
    if p.variable == "plain" and p.strategy == "mirrored" and p.step == "sgd":
        # A Keras optimizer made in MirroredStrategy's scope updates variables
        # made there only (an AssertionError, stock TensorFlow's too).
        return False
    return True


def generate(seed, count):
    """`count` valid programs drawn from a random generator seeded `seed`."""
    rng = random.Random(seed)
    programs = []
    while len(programs) < count:
        program = pinned(Program(**{name: rng.choice(choices)
                                    for name, choices in DIMENSIONS.items()}))
        if valid(program):
            programs.append(program)
    return programs


def shrink(program, fails):
    """The program closest to SIMPLEST (fewest choices away) reached from
    `program` by setting one choice at a time to SIMPLEST's, for which
    `fails(program)` still holds."""
    return shrink_towards(program, SIMPLEST,
                          lambda candidate: valid(candidate) and fails(candidate),
                          adjust=pinned)


def shrink_towards(program, simplest, fails, adjust=lambda program: program):
    """The program reached from `program` by setting one choice at a time
    to `simplest`'s (a {dimension: choice} of the dimensions to shrink),
    each candidate passed through `adjust`, while `fails(candidate)`."""
    changed = True
    while changed:
        changed = False
        for name, choice in simplest.items():
            if getattr(program, name) == choice:
                continue
            candidate = adjust(dataclasses.replace(program, **{name: choice}))
            if candidate != program and fails(candidate):
                program, changed = candidate, True
    return program


# The oracle --------------------------------------------------------------


def replicas_of(program, layout_replicas):
    """How many replicas the program's strategy has in a layout of
    `layout_replicas` devices."""
    return layout_replicas if program.strategy == "mirrored" else 1


def _replica_terms(program, n):
    """(a, K) for `n` replicas with inputs x_r = r + 1: replica r's value is
    z_r c_r, z_r = x_r v and c_r the collective's result, so the replicas'
    values add up to K v²; a tape inside replica r (TensorFlow's gradients
    of the collectives: an all-reduce of the cotangents, sliced for a
    gather) gives a[r] v."""
    x = [r + 1.0 for r in range(n)]
    sum_x, sum_x2 = sum(x), sum(xr * xr for xr in x)
    if program.collective == "none":  # c_r = z_r
        return [2.0 * xr * xr for xr in x], sum_x2
    if program.collective == "all_reduce_sum":  # c_r = S = v sum(x)
        return [2.0 * xr * sum_x for xr in x], sum_x * sum_x
    if program.collective == "all_reduce_mean":  # c_r = S / n
        return [2.0 * xr * sum_x / n for xr in x], sum_x * sum_x / n
    # all_gather: c_r = sum_k x_k z_k = v sum(x²)
    return [xr * sum_x2 + xr * xr * sum_x for xr in x], sum_x * sum_x2


def oracle(program, layout_replicas):
    """The right result of `program` (as `run` reports results), or REFUSE.

    Worked out on one device: the target is the sum over replicas of
    z_r c_r (`_replica_terms`: (x_r v)² without a collective), divided by
    the number of replicas for a MEAN reduce, plus EXTRA * v for the extra
    read; the gradient is its derivative in v, the second order its second
    derivative, the optimizer step v - lr * g.
    """
    p = program
    n = replicas_of(p, layout_replicas)
    on_read = p.variable.startswith("on_read")
    extra = EXTRA if p.extra_read else 0.0
    coefficients, total = _replica_terms(p, n)
    if p.in_replica:
        per_replica = [a * VALUE + extra for a in coefficients]
        if p.step == "sgd" and p.apply != "where_taken" and n > 1:
            return REFUSE  # Each replica's own gradient applied to every copy.
        result = {"gradient": [_with_unused(p, g) for g in per_replica]}
        if p.persistent:
            result["gradient_again"] = result["gradient"]
        if p.nested:
            result["second_order"] = coefficients
        if p.step == "sgd":  # Keras sums the replicas' gradients.
            result["weights"] = _shaped(p, VALUE - LEARNING_RATE * sum(per_replica),
                                        VALUE)
        return result
    if p.tape == "direct":
        value = VALUE * (n if p.variable == "on_read_sum" else 1)
        gradient, second = 2.0 * value + extra, 2.0
        if on_read and _gradient_in_scope(p):
            return REFUSE  # No one derivative in cross-replica context.
    else:
        scale = 1.0 / n if p.target == "reduce_mean" else 1.0
        if on_read and (n > 1 or _gradient_in_scope(p)):
            return REFUSE  # Each replica read its own component.
        gradient = scale * 2.0 * total * VALUE + extra
        second = scale * 2.0 * total
    result = {"gradient": _with_unused(p, gradient)}
    if p.persistent:
        result["gradient_again"] = result["gradient"]
    if p.nested:
        result["second_order"] = second
    if p.step == "sgd":
        result["weights"] = _shaped(p, VALUE - LEARNING_RATE * gradient, VALUE)
    return result


def _gradient_in_scope(program):
    """Whether the gradient is taken in cross-replica context."""
    return program.scope == "everything" and program.strategy != "none"


def _shaped(program, first, rest):
    """A value as the variable's shape has it: a scalar, or with a gather
    read a vector whose first element alone is read."""
    return first if program.read == "dense" else [first, rest]


def _with_unused(program, gradient):
    gradient = _shaped(program, gradient, 0.0)
    if program.unconnected == "none":
        return gradient
    zeros = _shaped(program, 0.0, 0.0)
    return [gradient, zeros if program.unconnected == "zero_extra" else None]


# Classification ----------------------------------------------------------


def same(found, expected):
    """Whether a run's result matches `expected` (structure, None and values
    within float32 rounding)."""
    if isinstance(expected, dict):
        return (isinstance(found, dict) and found.keys() == expected.keys() and
                all(same(found[k], expected[k]) for k in expected))
    if isinstance(expected, list):
        return (isinstance(found, list) and len(found) == len(expected) and
                all(same(f, e) for f, e in zip(found, expected)))
    if expected is None or found is None:
        return found is expected
    return bool(np.isclose(found, expected, rtol=1e-5, atol=1e-6))


def classify(expected, stock, with_tfdtape, alone, same=same):
    """The outcome (one of OUTCOMES) of a program whose oracle gave
    `expected`, from its runs on stock TensorFlow, with tfdtape and with
    tfdtape alone (each a result, or an exception as `describe` gives it);
    `same(found, expected)` tells whether a result is the expected one."""
    if not _same_outcome(with_tfdtape, alone, same):
        return "alone_differs"
    stock_right = expected != REFUSE and not _is_error(stock) and same(stock, expected)
    if _is_error(with_tfdtape):
        if stock_right:
            return "worse_than_stock"
        if with_tfdtape["error"].startswith("tfdtape: "):
            return "clear_error"
        if _is_error(stock) and _same_error(stock, with_tfdtape):
            return "stock_fails_alike"
        if with_tfdtape.get("noted"):
            return "clear_error"  # TensorFlow's, with tfdtape's note on where the tape belongs
        return "unclear_error"
    if expected != REFUSE and same(with_tfdtape, expected):
        return "right"
    return "worse_than_stock" if stock_right else "silent_wrong"


NOTES = ("tfdtape: this tape recorded the replicas",)
"""How the notes tfdtape adds to TensorFlow's errors begin
(`replica_recording.BACKWARD_NOTE`)."""


def describe(error):
    """An exception as a run reports it: its type, the line of its message
    that says what failed (tfdtape's, else the last: AutoGraph and graph
    execution put TensorFlow's own there), without the parts that differ
    from run to run (numbers of traced functions, nodes, addresses), and
    whether tfdtape added a note on where the tape belongs."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    # A note tfdtape adds to TensorFlow's error is not the error.
    noted = any(line.startswith(NOTES) for line in lines)
    lines = [line for line in lines if not line.startswith(NOTES)]
    ours = [line for line in lines if "tfdtape: " in line]
    line = (ours or lines or [""])[0 if ours else -1]
    line = line[line.find("tfdtape: "):] if ours else line
    line = re.sub(r"0x[0-9a-f]+", "0x?", line)
    line = re.sub(r"(__inference_\w+?_|_)\d+\b", r"\1?", line)
    return {"type": type(error).__name__, "error": line, "noted": noted}


def _same_error(one, other):
    return (one["type"], one["error"]) == (other["type"], other["error"])


def _is_error(result):
    return isinstance(result, dict) and "error" in result and "type" in result


def _same_outcome(one, other, same):
    if _is_error(one) or _is_error(other):
        return one == other
    return same(one, other) and same(other, one)


# Running a generator ----------------------------------------------------


def run_generator(script, devices, seed, cases, time_limit):
    """The records `script` (a generator's process beside this module, with
    `--devices`, `--seed`, `--cases` and `--shrink`) prints for one device
    layout, one JSON line each."""
    here = pathlib.Path(__file__).resolve().parent
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
                       PYTHONPATH=os.pathsep.join([str(here), *sys.path]))
    completed = subprocess.run(
        [sys.executable, str(here / script), "--devices", str(devices),
         "--seed", str(seed), "--cases", str(cases), "--shrink"],
        capture_output=True, text=True, env=environment, timeout=time_limit,
        check=False)
    assert completed.returncode == 0, (
        f"{script} exited with status {completed.returncode}:\n"
        f"{completed.stdout[-2000:]}\n{completed.stderr[-3000:]}")
    return [json.loads(line) for line in completed.stdout.splitlines()]


def stock_wrong(record, same=same):
    """Whether tfdtape was right where stock TensorFlow was not."""
    return record["outcome"] == "right" and not same(record["found"]["stock"],
                                                     record["expected"])


def outcome_summary(records, where, dimensions, same=same, notes=()):
    """Counts per outcome, the `notes` lines, and counts per dimension's
    choice, as text."""
    lines = [f"{len(records)} {where}: " +
             ", ".join(f"{outcome} {count}" for outcome, count in
                       collections.Counter(r["outcome"] for r in records).most_common()),
             "  right with tfdtape where stock is not: "
             f"{sum(stock_wrong(r, same) for r in records)}", *notes]
    for name in dimensions:
        counts = collections.defaultdict(collections.Counter)
        for record in records:
            counts[record["program"][name]][record["outcome"]] += 1
        lines.append(f"  {name}: " + "; ".join(
            f"{choice} " + "/".join(f"{o} {n}" for o, n in sorted(c.items()))
            for choice, c in sorted(counts.items(), key=lambda item: str(item[0]))))
    return "\n".join(lines)


def failures(records):
    """The records whose outcome is not PASSING, described for an assertion
    message (their first ten), or "" where there is none."""
    failing = [r for r in records if r["outcome"] not in PASSING]
    return "\n\n".join(
        f"{r['outcome']}: {json.dumps(r['program'])}\n  shrunk: "
        f"{json.dumps(r.get('shrunk'))}\n  expected: {r['expected']}\n  "
        f"found: {json.dumps(r['found'])[:1500]}" for r in failing[:10])


def search_size(config, ci, per_release):
    """(seed, cases per layout) for a generated-program test: from pytest's
    `--fuzz-seed` / `--fuzz-cases` (or TFDTAPE_FUZZ_SEED and
    TFDTAPE_FUZZ_CASES), else CI's (`ci`, a (seed, cases) pair), or under
    `--per-release` (the version stages) the `per_release` pair's."""
    default_seed, default_cases = per_release if config.getoption("per_release") else ci
    seed = config.getoption("fuzz_seed") or os.environ.get("TFDTAPE_FUZZ_SEED")
    cases = config.getoption("fuzz_cases") or os.environ.get("TFDTAPE_FUZZ_CASES")
    return (int(seed) if seed else default_seed), (int(cases) if cases else default_cases)
