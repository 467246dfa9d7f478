"""Generated Horovod programs and their oracle: plain NumPy, knowing nothing
of tfdtape (tests/test_generated_horovod.py).

A seed draws a list of cases; each is one call of a collective of Horovod's
API (every collective and grouped collective, every reduction, float16,
bfloat16, float32, float64, int32, int64 and bool where Horovod takes it,
scalars and tensors with no rows or elements, prescale and postscale,
fp16 compression, a process set, eager or in a tf.function, uneven first
dimensions, splits and roots; bool in the collectives that move values
without reducing them; the gradient through an allreduce, allgather or
broadcast under a tape, Horovod's), or one training step's gradients:
`DistributedGradientTape`'s, or a `DistributedOptimizer`'s updates over
several calls (`TRAINING`: Sum or Average, gradient_predivide_factor,
fp16 compression, `sparse_as_dense`, `backward_passes_per_step` with
`average_aggregated_gradients`, an embedding's IndexedSlices gradient,
processes with no rows). Every process of the job draws the same
cases and makes every process's inputs from (seed, case, rank), so the
oracle computes each process's expected result from the inputs alone:

- `expected(case, size, rank)` is `("value", array)`, `("refused", words)`
  where Horovod refuses the call (every process then must raise an error
  whose message holds `words`), or `("absent", None)` for a process outside
  the case's process set (it does not call).
"""

import dataclasses
import random
import re

import numpy as np

KINDS = ("allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast",
         "alltoall", "reducescatter", "grouped_reducescatter", "tape", "optimizer")
TRAINING = ("tape", "optimizer")
"""The kinds that train: a linear model of a dense weight (3, 2) and an
embedding table (5, 2), whose loss on a process's rows is
sum((x @ weight) * c) + sum(gather(table, ids) * d), so that its gradients
are x^T c and the IndexedSlices (d, ids): small integers, exact."""
LEARNING_RATE = 0.5
OPS = ("Sum", "Average", "Min", "Max", "Product")
DTYPES = ("float16", "bfloat16", "float32", "float64", "int32", "int64", "bool")
TOLERANCE = {"float16": 2e-3, "bfloat16": 2e-2, "float32": 1e-6, "float64": 1e-12}


@dataclasses.dataclass(frozen=True)
class Case:
    """One collective call, the same on every process but for its rows."""
    index: int
    kind: str
    op: str
    dtype: str
    rows: tuple  # rows per global rank (None: a scalar)
    tail: tuple  # the dimensions after the first
    tensors: int  # how many (grouped kinds)
    prescale: float
    postscale: float
    compression: str  # "none" or "fp16"
    traced: bool
    members: tuple  # the process set's global ranks; () for the global set
    root: int  # broadcast's root, a rank of the set
    splits: tuple  # alltoall's splits per sender (() for equal parts)
    gradient: bool = False  # also differentiated under a tape (Horovod's gradients)
    sparse_as_dense: bool = False  # TRAINING kinds' options from here on
    predivide: float = 1.0
    passes: int = 1  # backward_passes_per_step
    average_passes: bool = False  # average_aggregated_gradients
    steps: int = 1  # the optimizer's calls


def draw(seed, count, size):
    """`count` cases for a job of `size` processes."""
    rng = random.Random(seed * 1000 + size)
    return [_case(rng, index, size) for index in range(count)]


def _case(rng, index, size):
    kind = rng.choice(KINDS)
    if kind in TRAINING:
        return _training_case(rng, index, size, kind)
    reducing = kind in ("allreduce", "grouped_allreduce", "reducescatter",
                        "grouped_reducescatter")
    op = (rng.choice(("Sum", "Average")) if "reducescatter" in kind
          else rng.choice(OPS) if reducing else "Sum")
    dtype = rng.choice(DTYPES)
    if dtype == "bool" and reducing:  # Horovod gathers, sends and exchanges bools
        dtype = "int32"
    members = ()
    if size >= 3 and rng.random() < 0.25:
        members = tuple(sorted(rng.sample(range(size), 2)))
    group = len(members) or size
    tail = rng.choice(((), (2,), (3,), (0,), (2, 1)))
    scalar = kind in ("allreduce", "grouped_allreduce", "broadcast", "allgather",
                      "alltoall", "reducescatter") and rng.random() < 0.1
    if scalar:
        rows = (None,) * size
        tail = ()
    elif kind in ("allgather", "grouped_allgather"):
        rows = tuple(rng.choice((0, 1, 2, 3)) for _ in range(size))
    elif kind == "alltoall":
        rows = tuple(rng.choice((0, 1, 2, 3, 4)) for _ in range(size))
    else:
        same = rng.choice((0, 1, 2, 3, group, 2 * group + 1))
        rows = (same,) * size
    splits = ()
    if kind == "alltoall" and not scalar:
        if rng.random() < 0.7:
            splits = tuple(_cut(rng, rows[rank], group) for rank in range(size))
        else:  # equal parts
            rows = tuple(group * rng.choice((0, 1, 2)) for _ in range(size))
    floating = dtype.startswith(("float", "bfloat"))
    prescale = postscale = 1.0
    if reducing and dtype != "bool" and rng.random() < 0.3:
        prescale, postscale = rng.choice(((0.5, 1.0), (1.0, 2.0), (2.0, 0.5)))
    compression = "fp16" if reducing and floating and rng.random() < 0.2 else "none"
    return Case(index=index, kind=kind, op=op, dtype=dtype, rows=rows, tail=tail,
                tensors=rng.choice((1, 2, 3)) if kind.startswith("grouped") else 1,
                prescale=prescale, postscale=postscale, compression=compression,
                traced=rng.random() < 0.3, members=members,
                root=rng.randrange(group), splits=splits,
                gradient=(kind in ("allreduce", "allgather", "broadcast")
                          and dtype in ("float32", "float64") and op in ("Sum", "Average")
                          and compression == "none" and rng.random() < 0.5))


def _training_case(rng, index, size, kind):
    members = ()
    if size >= 3 and rng.random() < 0.25:
        members = tuple(sorted(rng.sample(range(size), 2)))
    op = rng.choice(("Sum", "Average"))
    passes = rng.choice((1, 1, 2, 3)) if kind == "optimizer" else 1
    return Case(index=index, kind=kind, op=op, dtype=rng.choice(("float32", "float64")),
                rows=tuple(rng.choice((0, 1, 2, 3)) for _ in range(size)), tail=(),
                tensors=1, prescale=1.0, postscale=1.0,
                compression="fp16" if rng.random() < 0.2 else "none",
                traced=rng.random() < 0.4, members=members, root=0, splits=(),
                sparse_as_dense=rng.random() < 0.5,
                predivide=2.0 if op == "Average" and rng.random() < 0.3 else 1.0,
                passes=passes, average_passes=passes > 1 and rng.random() < 0.5,
                steps=rng.choice((1, 2, 3, 4)) if kind == "optimizer" else 1)


def _cut(rng, rows, parts):
    """`rows` cut into `parts` counts (some may be 0)."""
    marks = sorted(rng.randint(0, rows) for _ in range(parts - 1))
    return tuple(b - a for a, b in zip([0, *marks], [*marks, rows]))


def numpy_dtype(name):
    if name == "bfloat16":
        import ml_dtypes
        return ml_dtypes.bfloat16
    return np.dtype(name)


def inputs(seed, case, rank):
    """Process `rank`'s tensors for `case` (a list, one per tensor), small
    integers in every dtype, so that sums and products are exact."""
    rng = np.random.default_rng([seed, case.index, rank])
    found = []
    for number in range(case.tensors):
        rows = case.rows[rank]
        shape = () if rows is None else (rows + number, *case.tail) if case.kind == (
            "grouped_allgather") else (rows, *case.tail)
        if case.dtype == "bool":
            found.append(rng.integers(0, 2, size=shape).astype(bool))
        else:
            low = 1 if case.op == "Product" else -3
            found.append(rng.integers(low, 4, size=shape).astype(numpy_dtype(case.dtype)))
    return found


def initial_variables(seed, case):
    """The TRAINING kinds' (weight, table) before the case, the same on
    every process."""
    rng = np.random.default_rng([seed, case.index, 99])
    return [rng.integers(-3, 4, size=shape).astype(case.dtype) for shape in ((3, 2), (5, 2))]


def batch(seed, case, rank, step):
    """Process `rank`'s (x, c, ids, d) for the optimizer's call `step` (the
    tape's: 0)."""
    rng = np.random.default_rng([seed, case.index, rank, step, 5])
    rows = case.rows[rank]
    return (rng.integers(-3, 4, size=(rows, 3)).astype(case.dtype),
            rng.integers(-2, 3, size=(rows, 2)).astype(case.dtype),
            rng.integers(0, 5, size=(rows,)).astype(np.int32),
            rng.integers(-2, 3, size=(rows, 2)).astype(case.dtype))


def local_gradients(seed, case, rank, step):
    """(weight's, table's densified) gradients of one process's loss."""
    x, c, ids, d = (value.astype(np.float64) if value.dtype != np.int32 else value
                    for value in batch(seed, case, rank, step))
    table = np.zeros((5, 2))
    np.add.at(table, ids, d)
    return [x.T @ c, table]


def _trained(seed, case, members):
    """The TRAINING kinds' results: the tape's all-reduced gradients, or
    the variables after the optimizer's `steps` calls (each Nth of
    `passes` applying the all-reduce of every process's sum, or mean, of
    its last N passes' gradients)."""
    group = len(members)

    def all_reduced(per_member):
        total = [sum(parts) for parts in zip(*per_member)]
        return [value / group for value in total] if case.op == "Average" else total

    if case.kind == "tape":
        return all_reduced([local_gradients(seed, case, member, 0) for member in members])
    variables = [value.astype(np.float64) for value in initial_variables(seed, case)]
    for step in range(case.passes - 1, case.steps, case.passes):
        window = range(step - case.passes + 1, step + 1)
        per_member = [[sum(parts) / (case.passes if case.average_passes else 1)
                       for parts in zip(*(local_gradients(seed, case, member, s)
                                          for s in window))] for member in members]
        variables = [value - LEARNING_RATE * update
                     for value, update in zip(variables, all_reduced(per_member))]
    return variables


def expected(seed, case, size, rank):
    """What process `rank` must get (module doc)."""
    members = list(case.members or range(size))
    if rank not in members:
        return ("absent", None)
    if case.kind in TRAINING:
        if case.predivide != 1.0 and not case.sparse_as_dense and case.passes == 1:
            return ("refused", "predivided")  # the table's IndexedSlices: Horovod's refusal
        return ("value", [value.astype(case.dtype) for value in _trained(seed, case, members)])
    group = len(members)
    place = members.index(rank)
    given = [inputs(seed, case, member) for member in members]
    scalar = case.rows[rank] is None
    if scalar and case.kind in ("allgather", "alltoall", "reducescatter"):
        return ("refused", "scalar")
    if case.kind == "alltoall" and not case.splits and any(
            case.rows[member] % group for member in members):
        return ("refused", "splits")
    results = []
    for number in range(case.tensors):
        values = [tensors[number] for tensors in given]
        if case.kind in ("allreduce", "grouped_allreduce"):
            results.append(_reduced(case, values, group))
        elif case.kind in ("allgather", "grouped_allgather"):
            results.append(np.concatenate(values, axis=0))
        elif case.kind == "broadcast":
            results.append(values[case.root])
        elif case.kind == "alltoall":
            results.append(_exchanged(case, values, members, place))
        else:
            reduced = _reduced(case, values, group)
            rows = reduced.shape[0]
            counts = [rows // group + (1 if part < rows % group else 0)
                      for part in range(group)]
            start = sum(counts[:place])
            results.append(reduced[start:start + counts[place]])
    return ("value", results)


def _reduced(case, values, group):
    dtype = values[0].dtype
    integer = np.issubdtype(dtype, np.integer)
    scaled = [_scale(value, case.prescale) for value in values]
    if case.compression == "fp16":
        scaled = [value.astype(np.float16) for value in scaled]
    wide = np.stack([value.astype(np.float64) for value in scaled])
    total = {"Sum": wide.sum(axis=0), "Average": wide.sum(axis=0), "Min": wide.min(axis=0),
             "Max": wide.max(axis=0), "Product": wide.prod(axis=0)}[case.op]
    result = total.astype(scaled[0].dtype).astype(dtype)
    if case.op == "Average" and integer:
        return np.trunc(result.astype(np.float64) * (case.postscale / group)).astype(dtype)
    if case.op == "Average":
        result = (result.astype(np.float64) / group).astype(dtype)
    return _scale(result, case.postscale)


def _scale(value, factor):
    """Horovod's scaling: integers in float64 truncated back, 16-bit floats
    in float32 rounded back."""
    if factor == 1.0:
        return value
    if np.issubdtype(value.dtype, np.integer):
        return np.trunc(value.astype(np.float64) * factor).astype(value.dtype)
    return (value.astype(np.float32 if value.dtype.itemsize == 2 else value.dtype)
            * factor).astype(value.dtype)


def _exchanged(case, values, members, place):
    received = []
    for sender, value in zip(members, values):
        counts = case.splits[sender] if case.splits else [len(value) // len(members)] * len(
            members)
        start = sum(counts[:place])
        received.append(value[start:start + counts[place]])
    return np.concatenate(received, axis=0)


def coefficients(seed, case, shape):
    """The weights of the loss `sum(result * coefficients)` a case with a
    gradient differentiates: the same on every process."""
    rng = np.random.default_rng([seed, case.index, 7919])
    return rng.integers(-2, 3, size=shape).astype(np.dtype(case.dtype))


def expected_gradient(seed, case, size, rank, result_shape):
    """The gradient of that loss for process `rank`'s input, as Horovod
    defines it: an all-reduce's is the all-reduce (same op and scales) of
    the upstream gradient; an allgather's is the average over the
    processes of the upstream gradient, this process's rows of it; a
    broadcast's is that average on the root, zeros elsewhere."""
    members = list(case.members or range(size))
    group, place = len(members), members.index(rank)
    upstream = coefficients(seed, case, result_shape).astype(np.float64)
    if case.kind == "allreduce":
        scale = case.prescale * case.postscale * (group if case.op == "Sum" else 1)
        return upstream * scale
    if case.kind == "allgather":
        start = sum(case.rows[member] for member in members[:place])
        return upstream[start:start + case.rows[rank]]
    return upstream if place == case.root else np.zeros_like(upstream)


def matches(case, found, wanted):
    """Whether the process's result `found` (its JSON: shapes, dtypes,
    values) is `wanted` (`expected`'s value list)."""
    if len(found) != len(wanted):
        return False
    for got, want in zip(found, wanted):
        if list(got["shape"]) != list(want.shape) or got["dtype"] != case.dtype:
            return False
        values = np.asarray(got["values"], np.float64).reshape(want.shape)
        target = want.astype(np.float64)
        tolerance = TOLERANCE.get(case.dtype, 0.0)
        if case.kind in TRAINING and case.compression == "fp16":  # means sent in float16
            tolerance = TOLERANCE["float16"]
        if not np.allclose(values, target, rtol=tolerance, atol=tolerance, equal_nan=True):
            return False
    return True


def judged(seed, cases, size, records):
    """(outcome counts, failures) of a job's `records` (per rank, per case,
    generated_horovod_process.py's JSON). A case is right when every
    process in its set got the oracle's value; refused when the oracle
    refuses it, or every process raised the same error (type and message)
    from tfdtape ("tfdtape: ..."); anything else, a failure."""
    counts = {"value": 0, "refused": 0}
    failing = []
    for case in cases:
        wanted = [expected(seed, case, size, rank) for rank in range(size)]
        found = [_same_words(records[rank][case.index]) for rank in range(size)]
        members = [rank for rank in range(size) if wanted[rank][0] != "absent"]
        if any("absent" not in found[rank] for rank in range(size) if rank not in members):
            failing.append((case, "a process outside the set called"))
            continue
        errors = [found[rank] for rank in members if "error" in found[rank]]
        if wanted[members[0]][0] == "refused":
            words = wanted[members[0]][1]
            if len(errors) == len(members) and all(
                    words in error["message"].lower() for error in errors) and all(
                    error == errors[0] for error in errors):
                counts["refused"] += 1
            else:
                failing.append((case, f"not refused alike ({words}): {found}"))
            continue
        if errors:
            if (len(errors) == len(members) and all(error == errors[0] for error in errors)
                    and "tfdtape: " in errors[0]["message"][:40]):
                counts["refused"] += 1
            else:
                failing.append((case, f"errors: {errors}"))
            continue
        wrong = [rank for rank in members
                 if not matches(case, found[rank]["results"], wanted[rank][1])
                 or (case.kind == "tape"  # the table's gradient: IndexedSlices, as Horovod's
                     and found[rank]["sparse"] != (not case.sparse_as_dense))
                 or (case.gradient and not matches(case, found[rank]["gradients"], [
                     expected_gradient(seed, case, size, rank, wanted[rank][1][0].shape)]))]
        if wrong:
            failing.append((case, f"wrong on ranks {wrong}: "
                                  f"{[found[rank] for rank in wrong]} against "
                                  f"{[wanted[rank][1] for rank in wrong]}"))
        else:
            counts["value"] += 1
    return counts, failing


def _same_words(record):
    """`record` with an error's message as every process words it: without
    the numbered names TensorFlow gives the traced function it was raised
    in (`__inference_run_1978`)."""
    if "message" not in record:
        return record
    return dict(record, message=re.sub(r"__inference_[\w<>]*?_\d+", "__inference",
                                       record["message"]))
