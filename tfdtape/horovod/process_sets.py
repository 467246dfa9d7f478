"""Horovod's process sets: collectives among some of the job's processes.

A `ProcessSet` names global ranks; `init(process_sets=[...])` and
`add_process_set` register it under an id (0 is `global_process_set`,
every process), which every process must do alike and in the same order,
as Horovod requires. Its collectives run over a TensorFlow collective group
of the member processes alone (`collectives.within`), with a group key of
its own: TensorFlow forms a group when its members first meet, so sets can
be added and removed at any time (Horovod's dynamic process sets). An id is
never given twice, so a removed set's group is never met again.
"""

import tensorflow as tf

from tfdtape import errors
from tfdtape.horovod import basics

_SYMBOL = "tfdtape.horovod.ProcessSet"


class ProcessSet:
    """Horovod's: the processes of `ranks` (global ranks, kept sorted), with
    an id once registered (`process_set_id`, None before and after
    removal)."""

    process_set_id = None
    ranks = None

    def __init__(self, ranks):
        given = ranks
        ranks = list(ranks) if not isinstance(ranks, (str, bytes)) and hasattr(
            ranks, "__iter__") else None
        if ranks is None or not all(isinstance(rank, int) for rank in ranks):
            raise ValueError(errors.message(
                "a ProcessSet of something other than ranks", _SYMBOL,
                "a list of global ranks (ints)", repr(given),
                "pass the ranks of its processes, e.g. hvd.ProcessSet([0, 2])"))
        self.ranks = sorted(ranks)

    def size(self):
        """The number of its processes, or None where not registered."""
        if self.process_set_id is None:
            return None
        return len(_registered[self.process_set_id])

    def rank(self):
        """This process's rank within the set, or None where not registered.

        Raises:
            ValueError: this process is not in the set.
        """
        if self.process_set_id is None:
            return None
        ranks = _registered[self.process_set_id]
        if basics.rank() not in ranks:
            raise ValueError(errors.message(
                "the rank in a process set this process is not in", _SYMBOL,
                f"a process of {list(ranks)}", f"rank {basics.rank()}",
                "ask rank() of a set that holds this process (see included())"))
        return ranks.index(basics.rank())

    def included(self):
        """Whether this process is in the set (None before `init()`)."""
        if self.ranks is None or not basics.is_initialized():
            return None
        return basics.rank() in self.ranks

    def __repr__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0

_registered = {}  # id -> the tuple of its global ranks
_next_id = [1]


def init(comm=None, process_sets=None):
    """Horovod's `hvd.init`: joins the job (`basics.init`), then registers
    every process as set 0 and `process_sets` (ProcessSets or lists of
    ranks) in order; every process must give the same. A set whose ranks
    another one already holds is left without an id, as Horovod leaves it.

    Raises:
        ValueError: a process set of ranks the job does not have.
        As `basics.init`.
    """
    basics.init(comm)
    size = basics.size()
    _registered.clear()
    _registered[0] = tuple(range(size))
    global_process_set.ranks = list(range(size))
    for process_set in process_sets or ():
        if not isinstance(process_set, ProcessSet):
            process_set = ProcessSet(process_set)
        if tuple(process_set.ranks) in _registered.values():
            process_set.process_set_id = None
            continue
        _register(process_set)


def _register(process_set):
    size = len(_registered[0])
    if not process_set.ranks or not all(0 <= rank < size for rank in process_set.ranks) \
            or len(set(process_set.ranks)) != len(process_set.ranks):
        raise ValueError(errors.message(
            "a process set of ranks the job does not have", _SYMBOL,
            f"distinct ranks from 0 to {size - 1}", repr(process_set.ranks),
            "name processes of this job, each once"))
    process_set.process_set_id = _next_id[0]
    _registered[_next_id[0]] = tuple(process_set.ranks)
    _next_id[0] += 1


def add_process_set(process_set):
    """Horovod's: registers `process_set` (a ProcessSet or a list of ranks)
    and returns it; every process must add the same sets in the same order.

    Raises:
        ValueError: a set with the same ranks exists, or ranks the job does
            not have.
    """
    basics.job()
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if tuple(process_set.ranks) in _registered.values():
        raise ValueError(errors.message(
            "a process set was added twice", "tfdtape.horovod.add_process_set",
            "ranks no registered set holds", repr(process_set.ranks),
            "use the set registered with these ranks"))
    _register(process_set)
    return process_set


def remove_process_set(process_set):
    """Horovod's: unregisters `process_set`; whether it was registered (the
    global set is never removed).

    Raises:
        TypeError: something other than a ProcessSet.
    """
    if not isinstance(process_set, ProcessSet):
        raise TypeError(errors.message(
            "remove_process_set was given something other than a ProcessSet",
            "tfdtape.horovod.remove_process_set", "the ProcessSet add_process_set "
            "or init registered", type(process_set).__name__,
            "pass the ProcessSet object itself"))
    process_set_id = process_set.process_set_id
    if process_set_id is None or process_set_id == 0 or process_set_id not in _registered:
        return False
    del _registered[process_set_id]
    process_set.process_set_id = None
    return True


def size_op(process_set_id=0, name=None):
    """The size of the process set `process_set_id` (0: the job) as an
    int32 tensor, as Horovod's graph op gives it."""
    return tf.constant(size_of(process_set_id), tf.int32, name=name)


def process_set_included_op(process_set_id=0, name=None):
    """Whether this process is in the process set `process_set_id`: an
    int32 tensor, 1 or 0, as Horovod's."""
    size_of(process_set_id)
    return tf.constant(int(basics.rank() in _registered[process_set_id]), tf.int32,
                       name=name)


def includes(process_set, symbol):
    """Whether `process_set` (None: every process) holds this process.

    Raises:
        ValueError: a set that is not registered.
    """
    try:
        members(process_set, symbol)
    except tf.errors.InvalidArgumentError:
        return False
    return True


def members(process_set, symbol):
    """(the id, the global ranks) of `process_set` (None: every process),
    which must hold this process.

    Raises:
        ValueError: a set that is not registered (Horovod's error for it).
        tf.errors.InvalidArgumentError: a set without this process (Horovod's).
    """
    if process_set is None:
        process_set = global_process_set
    process_set_id = getattr(process_set, "process_set_id", None)
    if process_set_id not in _registered or (
            process_set_id != 0 and tuple(process_set.ranks) != _registered[process_set_id]):
        raise ValueError(errors.message(
            "a collective in a process set that is not registered", symbol,
            "hvd.global_process_set or a set given to hvd.init(process_sets=...) or "
            "hvd.add_process_set", repr(process_set),
            "register the set on every process first"))
    ranks = _registered[process_set_id]
    if basics.rank() not in ranks:
        raise tf.errors.InvalidArgumentError(None, None, errors.message(
            "a collective in a process set this process is not in", symbol,
            f"a process of {list(ranks)}", f"rank {basics.rank()}",
            "call it on the set's processes only"))
    return process_set_id, ranks


def members_of(process_set_id):
    """The global ranks of the registered set `process_set_id`."""
    return _registered[process_set_id]


def size_of(process_set_id):
    """The size of the registered set `process_set_id`.

    Raises:
        ValueError: no set is registered under it.
    """
    basics.job()
    if process_set_id not in _registered:
        raise ValueError(errors.message(
            "a process set id that is not registered", "tfdtape.horovod",
            f"one of {sorted(_registered)}", repr(process_set_id),
            "pass the process_set_id of a registered set"))
    return len(_registered[process_set_id])
