"""TensorFlow's collectives over the job (`basics.Job`), unchecked: the
all-reduce, all-gather and broadcast that `ops` issues once `negotiation`
found every process issuing the same one.

Each runs on this process's device among the processes of the process set
in effect (`within`; every process by default): for every process, with the
strategy's group and instance keys and its ordering token, so that
collectives of one tf.function run in program order; for a set, with a
group of the set's own (`process_sets`). In a group of one process each is
the identity.
"""

import contextlib
import contextvars
import dataclasses

import tensorflow as tf
from tensorflow.python.distribute import collective_util
from tensorflow.python.distribute import cross_device_utils
from tensorflow.python.ops import collective_ops
from tensorflow.python.ops import control_flow_util

from tfdtape import errors
from tfdtape.horovod import basics
from tfdtape.horovod import process_sets

Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
"""Horovod's reduction ops, with its values."""

OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max",
            Product: "Product"}
MERGES = {Average: "Add", Sum: "Add", Min: "Min", Max: "Max", Product: "Mul"}
"""TensorFlow's merge op of each reduction op this engine has."""

_WIDENED = (tf.bool, tf.int8, tf.uint8, tf.int16, tf.uint16)
"""Dtypes TensorFlow's collectives do not carry: sent as int32."""


_SET_GROUP_KEYS = 1 << 24
"""A process set's group key is this plus its id: far above the keys the
strategy gives out (from 1, one per group of devices)."""


@dataclasses.dataclass(frozen=True)
class Group:
    """The processes a collective runs among: their global `ranks`, this
    process's `rank` among them, and the launcher of their collectives."""
    ranks: tuple
    rank: int
    launcher: object

    @property
    def size(self):
        return len(self.ranks)


_current = contextvars.ContextVar("tfdtape_horovod_process_set", default=0)
_groups = {}  # (the job, a process set's id) -> Group


@contextlib.contextmanager
def within(process_set, symbol):
    """Runs the block's collectives among `process_set`'s processes (None:
    the set in effect, every process at the top), checked as
    `process_sets.members` checks it."""
    if process_set is None:
        process_set_id = _current.get()
    else:
        process_set_id, _ = process_sets.members(process_set, symbol)
    with resumed(process_set_id):
        yield


@contextlib.contextmanager
def resumed(process_set_id):
    """Runs the block's collectives in the set `current_set()` gave (a
    gradient's, computed after its collective's block ended)."""
    token = _current.set(process_set_id)
    try:
        yield
    finally:
        _current.reset(token)


def current_set():
    """The id of the process set in effect (0: every process)."""
    return _current.get()


def group():
    """The Group of the process set in effect."""
    job = basics.job()
    process_set_id = _current.get()
    key = (id(job), process_set_id)
    if key not in _groups:
        ranks = tuple(range(job.size)) if process_set_id == 0 else \
            process_sets.members_of(process_set_id)
        _groups[key] = Group(ranks=ranks, rank=ranks.index(job.rank),
                             launcher=_launcher(job, process_set_id, len(ranks)))
    return _groups[key]


def _launcher(job, process_set_id, size):
    """The job's launcher for set 0; for another set, one of its own: its
    group key, its instance keys, this process's device."""
    if process_set_id == 0 or size == 1:
        return job.launcher
    group_key = _SET_GROUP_KEYS + process_set_id
    keys = cross_device_utils.CollectiveKeys(group_key_start=group_key)
    keys.get_group_key([job.device])  # registers the group's instance keys
    with tf.init_scope():
        return cross_device_utils.CollectiveReplicaLauncher(
            group_key, size, keys, job.device, collective_util.Options())


def size():
    """The number of processes of the process set in effect."""
    return group().size


def rank():
    """This process's rank among the process set in effect."""
    return group().rank


def sendable(tensor, symbol, reduced=False):
    """(`tensor` as a dtype the collectives carry, the function that casts
    a result back to `tensor`'s dtype). A bfloat16 tensor that is only
    moved (gathered, broadcast, exchanged: TensorFlow's collectives other
    than the all-reduce do not take bfloat16) travels as its bits (int16,
    widened), every NaN's payload and sign kept; one `reduced` is reduced
    as it is.

    Raises:
        ValueError: a string, resource or variant tensor.
    """
    dtype = tensor.dtype
    if dtype in (tf.string, tf.resource, tf.variant):
        raise ValueError(errors.message(
            "a tensor of a dtype no collective carries", symbol,
            "a numeric or bool tensor", dtype.name, "send it as numbers"))
    if dtype in _WIDENED:
        return tf.cast(tensor, tf.int32), lambda result: tf.cast(result, dtype)
    if dtype == tf.bfloat16 and not reduced:
        return (tf.cast(tf.bitcast(tensor, tf.int16), tf.int32),
                lambda result: tf.bitcast(tf.cast(result, tf.int16), dtype))
    return tensor, lambda result: result


def _refuse_session_graph():
    """Raises where the collective is built in a TensorFlow 1 graph (one a
    `tf.compat.v1.Session` runs, not a tf.function's): that session runs
    on this process alone and cannot place the job's collectives.

    Raises:
        NotImplementedError: in such a graph.
    """
    if not tf.executing_eagerly() and not getattr(
            tf.compat.v1.get_default_graph(), "building_function", False):
        raise NotImplementedError(errors.message(
            "a collective across processes in a TensorFlow 1 graph", "tfdtape.horovod",
            "an eager call or a tf.function", "a graph for tf.compat.v1.Session",
            "run eagerly or in a tf.function (TensorFlow 2), e.g. "
            "hvd.broadcast_variables(variables, root_rank) once the variables exist"))


def _refuse_xla():
    """Raises where the collective would be compiled by XLA (a tf.function
    with jit_compile=True, which Keras 3's `fit` picks by default on a host
    with a GPU): XLA would compile it as an all-reduce of its own replicas,
    not of this job's processes.

    Raises:
        ValueError: in an XLA context.
    """
    if control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
        raise ValueError(errors.message(
            "a collective across processes in a function XLA compiles", "tfdtape.horovod",
            "a step traced without XLA", "jit_compile=True",
            "compile without XLA: model.compile(..., jit_compile=False), or "
            "tf.function(jit_compile=False)"))


def _launched(collective, tensor, **options):
    job, members = basics.job(), group()
    if members.size == 1:
        return tf.identity(tensor)
    _refuse_session_graph()
    _refuse_xla()
    launcher = members.launcher
    with tf.device(job.device):
        return collective(tensor, members.size, launcher._group_key,
                          launcher._next_instance_key(),
                          ordering_token=launcher._get_ordering_token(), **options)


def _may_be_empty(tensor):
    """Whether `tensor` may hold no element: TensorFlow's collectives end
    the process (SIGSEGV, TensorFlow 2.21) on some such tensors (one made
    from an empty NumPy array), so they travel padded with one element."""
    elements = tensor.shape.num_elements()
    return elements is None or elements == 0


def _padded(tensor):
    """`tensor` flat, with one zero element after its own."""
    return tf.concat([tf.reshape(tensor, [-1]), tf.zeros([1], tensor.dtype)], 0)


def all_reduce(tensor, op):
    """`tensor` merged over the processes by `op` (Average is a sum here:
    the caller divides); the same shape and dtype on every process (one of
    no elements too: it is reduced padded)."""
    if not _may_be_empty(tensor):
        return _launched(collective_ops.all_reduce_v2, tensor, merge_op=MERGES[op],
                         final_op="Id")
    reduced = _launched(collective_ops.all_reduce_v2, _padded(tensor),
                        merge_op=MERGES[op], final_op="Id")
    return tf.reshape(reduced[:-1], tf.shape(tensor))


def all_gather(tensor):
    """Every process's `tensor` concatenated along the first dimension, in
    rank order; the same shape and dtype on every process (one of no
    elements too: each process's travels padded)."""
    if not _may_be_empty(tensor):
        return _launched(collective_ops.all_gather_v2, tensor)
    gathered = _launched(collective_ops.all_gather_v2, _padded(tensor))
    shape = tf.shape(tensor)
    rows = tf.reshape(gathered, [group().size, -1])[:, :-1]
    return tf.reshape(rows, tf.concat([[group().size * shape[0]], shape[1:]], 0))


def broadcast(tensor, root_rank):
    """`root_rank`'s `tensor` on every process; the others' `tensor` gives
    only the shape and dtype, which must be the root's."""
    job, members = basics.job(), group()
    if members.size == 1:
        return tf.identity(tensor)
    _refuse_session_graph()
    _refuse_xla()
    launcher = members.launcher
    sent = _padded(tensor) if _may_be_empty(tensor) else tensor
    with tf.device(job.device):
        if job.rank == root_rank:
            received = collective_ops.broadcast_send_v2(
                sent, members.size, launcher._group_key, launcher._next_instance_key())
        else:
            received = collective_ops.broadcast_recv_v2(
                tf.shape(sent), sent.dtype, members.size, launcher._group_key,
                launcher._next_instance_key())
    if sent is tensor:
        return received
    return tf.reshape(received[:-1], tf.shape(tensor))


def has_all_to_all():
    """Whether this TensorFlow has the all-to-all collective (2.13 and
    later; 2.12 composes it from an all-gather)."""
    return hasattr(collective_ops, "all_to_all_v2")


def all_to_all(tensor):
    """Row i of `tensor` (its first dimension the job's size) sent to rank
    i; row i of the result received from rank i. The same shape and dtype
    on every process. TensorFlow's all-to-all where the release has it,
    else an all-gather of every row, of which each process keeps its own."""
    members = group()
    if members.size == 1:
        return tf.identity(tensor)
    if has_all_to_all():
        return _launched(collective_ops.all_to_all_v2, tensor)
    return all_gather(tensor[None])[:, members.rank]  # [senders, receivers, ...] gathered
