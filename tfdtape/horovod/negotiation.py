"""Every process issues the same collective, or every process raises.

Horovod's coordinator checks, before each collective, that every process
asked for the same one. Here, before each of `ops`' collectives, the
processes all-gather a description of it (one int32 vector of fixed length:
which collective, which op, which root, how many tensors, their dtypes and
shapes, which gradients are None) and every process compares all of them.
Where they differ, every process raises the same error before the
collective runs (eagerly tf.errors.FailedPreconditionError, as Horovod;
in a tf.function an assertion the collective depends on), instead of
pairing different tensors or waiting on a collective that never comes.

For an all-gather the description also carries the first dimension, which
may differ between processes: the gather's row counts cost no collective of
their own. It also carries what this process is about to refuse (a scalar
to gather, splits that do not fit): where one process refuses a collective
that depends on its tensors, every process raises (the refusal itself where
all refuse alike, else FailedPreconditionError naming each process's), and
none is left waiting on a collective that never comes.
"""

import zlib

import tensorflow as tf

from tfdtape import errors
from tfdtape.horovod import collectives

KINDS = ("allreduce", "grouped_allreduce", "allgather", "broadcast",
         "broadcast_variables", "gradient all-reduce", "alltoall", "reducescatter",
         "grouped_reducescatter")
REFUSALS = ("nothing", "a scalar to gather", "a scalar to reduce-scatter", "a scalar to exchange",
            "a first dimension that does not split evenly over the processes",
            "splits that do not fit the tensor")
"""What a process may be about to refuse, by the code its description carries."""
_FIELDS = ("kind of collective", "reduction op", "root rank", "number of tensors", "dtypes",
           "shapes", "gradients that are None", "name") + ("shape",) * 7
_NONE_FIELD = _FIELDS.index("gradients that are None")
_GROUP_FIELDS = 8  # The fields that describe a group of tensors (and ride in one).
_SINGLE_SHAPE = _GROUP_FIELDS  # Where a single tensor's shape as run starts: its rank, 6 dims.
_ROWS = len(_FIELDS)  # The slot after the compared fields: an all-gather's rows.
_REFUSAL = _ROWS + 1  # Then the code of what this process refuses (REFUSALS).
_NOT_GIVEN = -1


def _digest(text):
    return zlib.crc32(text.encode()) & 0x7FFFFFFF


def _runtime_shape(tensor, skip_first):
    """[rank, 5 dims, the product of the others] of `tensor` as run, -1
    where it has none (the first dim 0 for an all-gather)."""
    shape = tf.shape(tensor, out_type=tf.int32)
    if skip_first:
        shape = tf.concat([[0], shape[1:]], 0)
    head = tf.concat([shape, tf.fill([5], _NOT_GIVEN)], 0)[:5]
    rest = tf.where(tf.size(shape) > 5, tf.reduce_prod(shape[5:]), _NOT_GIVEN)
    return tf.concat([tf.size(shape, out_type=tf.int32)[None], head, rest[None]], 0)


def _values(tensor):
    return tensor.values if isinstance(tensor, tf.IndexedSlices) else tensor


_MODULUS = 2**31 - 1
_POSITION = 2654435761  # Knuth's multiplicative hash of a dimension's position


def _shape(tensor):
    """`tensor`'s shape, an IndexedSlices' rows (which may differ) left out:
    a list of ints where known when built, else an int64 tensor."""
    value = _values(tensor)
    known = value.shape.as_list() if value.shape.is_fully_defined() else None
    if isinstance(tensor, tf.IndexedSlices):
        known = value.shape.as_list()[1:] if value.shape[1:].is_fully_defined() else None
        return known if known is not None else tf.shape(value, out_type=tf.int64)[1:]
    return known if known is not None else tf.shape(value, out_type=tf.int64)


def _shapes_digest(tensors):
    """A digest of the shapes of `tensors` as run, below 2**31: each dim
    (after its tensor's rank) weighted by its position. A Python int where
    every shape is known when built, else an int64 tensor of the same
    value."""
    shapes = [_shape(tensor) for tensor in tensors]
    if all(isinstance(shape, list) for shape in shapes):
        dims = [dim for shape in shapes for dim in [len(shape), *shape]]
        return sum(dim % _MODULUS * (position * _POSITION % _MODULUS) % _MODULUS
                   for position, dim in enumerate(dims, 1)) % _MODULUS
    dims = tf.concat([tf.concat([tf.size(shape, out_type=tf.int64)[None],
                                 tf.cast(shape, tf.int64)], 0) for shape in shapes], 0)
    dims = dims % _MODULUS
    weights = (tf.range(1, tf.size(dims, out_type=tf.int64) + 1) * _POSITION) % _MODULUS
    return tf.reduce_sum(dims * weights % _MODULUS) % _MODULUS


def _fields(kind, tensors, op, root_rank, absent, name, single):
    """The description's first _GROUP_FIELDS fields: one dense tensor
    (`single`) by its dtype, several by digests of their dtypes and of
    their shapes as run. A list of ints where all are known when built,
    else an int64 tensor."""
    values = [_values(tensor) for tensor in tensors]
    shapes = _NOT_GIVEN if single or not tensors else _shapes_digest(tensors)
    fields = [KINDS.index(kind), op, root_rank, len(values),
              values[0].dtype.as_datatype_enum if single else _digest(
                  repr([value.dtype.name for value in values])),
              shapes, _digest(repr(list(absent))), _digest(repr(name))]
    if isinstance(shapes, int):
        return fields
    return tf.stack([tf.cast(field, tf.int64) for field in fields])


def describe(kind, tensors, op=_NOT_GIVEN, root_rank=_NOT_GIVEN, absent=(), name=None,
             rows=None, refusal=0):
    """The int32 description of a collective of `kind` on `tensors`: with
    `absent`, which of a tape's sources had a None gradient; with `name`,
    the name the caller gave it (Horovod pairs collectives by name); with
    `rows`, an all-gather's first dimension (not compared); with `refusal`,
    the index in REFUSALS (an int or int32 scalar tensor) of what this
    process refuses. One dense tensor is described by its shape as run,
    several by a digest of theirs."""
    single = len(tensors) == 1 and not absent and not isinstance(
        tensors[0], tf.IndexedSlices)
    fields = tf.cast(_fields(kind, tensors, op, root_rank, absent, name, single), tf.int32)
    shape = (_runtime_shape(_values(tensors[0]), kind in ("allgather", "alltoall")) if single
             else tf.fill([7], _NOT_GIVEN))
    rows = tf.reshape(tf.cast(0 if rows is None else rows, tf.int32), [1])
    refusal = tf.reshape(tf.cast(refusal, tf.int32), [1])
    return tf.concat([fields, shape, rows, refusal], 0)


RIDER_DTYPES = (tf.float32, tf.float64)
RIDER_MOST_PROCESSES = 64
"""Where a rider's sums stay exact whatever the scaling (float32)."""
_NIBBLES = 8  # per field: its 32 bits, 4 at a time


def rider(kind, tensors, dtype, op, absent=()):
    """The check of a Sum or Average all-reduce of `tensors` that travels
    inside it, as `dtype` (one of RIDER_DTYPES): the description's first
    fields (those of a group) in nibbles (0 to 15), then their squares. Summed over the
    processes, a field's nibbles agree on every process exactly when
    size * (sum of squares) == (sum)² for each: a verdict every process
    reaches alike, at no collective of its own."""
    fields = _fields(kind, tensors, op, _NOT_GIVEN, absent, None, single=False)
    if isinstance(fields, list):
        nibbles = [field % 2**32 >> 4 * place & 15
                   for field in fields for place in range(_NIBBLES)]
        return tf.constant(nibbles + [nibble * nibble for nibble in nibbles], dtype)
    places = tf.constant([4 * place for place in range(_NIBBLES)], tf.int64)
    nibbles = tf.reshape(tf.bitwise.bitwise_and(
        tf.bitwise.right_shift((fields % 2**32)[:, None], places[None, :]), 15), [-1])
    return tf.cast(tf.concat([nibbles, nibbles * nibbles], 0), dtype)


def rider_differs(reduced, scale):
    """Per field of a group, whether the processes' riders differed, from the
    all-reduced rider (their sum times `scale`)."""
    sums = tf.round(tf.cast(reduced, tf.float64) / scale)
    first, second = tf.split(sums, 2)
    differs = tf.not_equal(collectives.size() * second, first * first)
    return tf.reduce_any(tf.reshape(differs, [-1, _NIBBLES]), axis=1)


def checked(differs, results, symbol, describe_again):
    """`results` once no field `differs`. Else, eagerly, every process
    repeats the check as an all-gather (`describe_again()`, a description)
    for the error that names each process's value; in a tf.function, an
    assertion the results depend on names the first field that differs."""
    if tf.executing_eagerly():
        if bool(tf.reduce_any(differs)):
            agreed(describe_again(), symbol)
            raise tf.errors.FailedPreconditionError(None, None, _message(
                symbol, _FIELDS[int(_named_field(differs))], "a difference"))
        return results
    text = tf.gather(tf.constant([_message(symbol, name, "a difference")
                                  for name in _FIELDS[:_GROUP_FIELDS]]), _named_field(differs))
    check = tf.debugging.Assert(tf.logical_not(tf.reduce_any(differs)), [text])
    with tf.control_dependencies([check]):
        return [tf.identity(result) if not isinstance(result, tf.IndexedSlices) else
                tf.IndexedSlices(tf.identity(result.values), result.indices,
                                 result.dense_shape)
                for result in results]


def agreed(description, symbol, refusal=None):
    """Every process's `description`, shape [size, fields + 2], once all
    agree and none refuses (the last two columns, an all-gather's rows and
    a refusal's code, are not compared). `refusal`: the exception this
    process raises where its description carries a refusal.

    Raises:
        `refusal`: eagerly, where every process refuses alike.
        tf.errors.FailedPreconditionError: eagerly, on every process, when
            some processes refuse (or refuse otherwise), or the processes
            described different collectives.
        tf.errors.InvalidArgumentError: the same, in a tf.function.
    """
    everyone = tf.reshape(collectives.all_gather(description), [collectives.size(), -1])
    differs = tf.reduce_any(tf.not_equal(everyone[:, :_ROWS], everyone[:1, :_ROWS]),
                            axis=0)
    refused = everyone[:, _REFUSAL]
    if tf.executing_eagerly():
        codes = refused.numpy()
        if codes.any():
            if refusal is not None and (codes == codes[0]).all():
                raise refusal
            raise tf.errors.FailedPreconditionError(None, None, _refused_message(
                symbol, "refused " + ", ".join(
                    f"process {rank}: {REFUSALS[code]}" for rank, code in enumerate(codes))))
        if differs.numpy().any():
            field = int(_named_field(differs))
            raise tf.errors.FailedPreconditionError(None, None, _message(
                symbol, _FIELDS[field], _found(field, everyone.numpy())))
        return everyone
    text = tf.gather(tf.constant([_message(symbol, name, "a difference")
                                  for name in _FIELDS]), _named_field(differs))
    none_refused = tf.debugging.Assert(
        tf.reduce_all(tf.equal(refused, 0)),
        [_refused_message(symbol, "a refusal on a process"), "what each process refused:",
         tf.gather(tf.constant(REFUSALS), refused)], summarize=-1)
    with tf.control_dependencies([none_refused]):  # a refusal is reported first
        check = tf.debugging.Assert(tf.logical_not(tf.reduce_any(differs)),
                                    [text, "descriptions per process:", everyone],
                                    summarize=-1)
    with tf.control_dependencies([check]):
        return tf.identity(everyone)


def _named_field(differs):
    """The index of the field an error names among those that `differs`
    (a bool per field): the gradients that are None where they differ (the
    tensors' number, dtypes and shapes then differ because of them), else
    the first."""
    first = tf.argmax(tf.cast(differs, tf.int32), output_type=tf.int32)
    return tf.where(differs[_NONE_FIELD], tf.constant(_NONE_FIELD, tf.int32), first)


def _shape_as_run(row):
    rank = int(row[_SINGLE_SHAPE])
    dims = [int(dim) for dim in row[_SINGLE_SHAPE + 1:_SINGLE_SHAPE + 1 + min(rank, 5)]]
    if rank > 5:
        dims.append(f"{int(row[_SINGLE_SHAPE + 6])} in all")
    if dims and row[0] in (KINDS.index("allgather"), KINDS.index("alltoall")):
        dims[0] = int(row[_ROWS])
    return dims


def _found(field, found):
    """Each process's value of `field` in words, where it reads as one."""
    name = _FIELDS[field]
    single = found[0, _SINGLE_SHAPE] != _NOT_GIVEN
    if name == "kind of collective":
        said = [KINDS[value] for value in found[:, field]]
    elif name == "reduction op":
        said = [collectives.OP_NAMES.get(int(value), "none") for value in found[:, field]]
    elif name in ("root rank", "number of tensors"):
        said = [int(value) for value in found[:, field]]
    elif name == "dtypes" and single:
        said = [tf.dtypes.as_dtype(int(value)).name for value in found[:, field]]
    elif name == "shape":
        said = [_shape_as_run(row) for row in found]
    else:
        return f"{name}: not the same on every process"
    return ", ".join(f"process {rank}: {value}" for rank, value in enumerate(said))


def rows(everyone):
    """Each process's all-gather rows, from `agreed`'s descriptions."""
    return everyone[:, _ROWS]


def _refused_message(symbol, found):
    return errors.message(
        "processes of the job refused the collective", symbol,
        "tensors every process can send", found,
        "give every process tensors the collective takes (each refusal's own "
        "error says how, on the process that refused)")


def _message(symbol, field, found):
    if field == "gradients that are None":
        return errors.message(
            "the processes of the job disagree on which gradients are None", symbol,
            "the same sources with a None gradient on every process",
            "a gradient None on some processes only",
            "make every process's loss use the same variables, or pass the same "
            "sources everywhere")
    return errors.message(
        f"the processes of the job issued different collectives (they differ in {field})",
        symbol, "every process issuing the same collectives, in the same order, "
        "on tensors of the same dtypes and shapes", found,
        "make every process run the same collectives in the same order (a "
        "collective under a condition that differs between processes pairs "
        "with another one)")
