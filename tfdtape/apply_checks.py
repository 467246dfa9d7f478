"""What an apply of gradients in cross-replica context, or an all-reduce in
the replicas, is refused for: the checks that keep replicas and workers
from drifting apart, or a total from being counted again.

- per-replica values applied in cross-replica context: each replica's copy
  would get its own value (`check_no_per_replica_values`);
- gradients applied outside strategy.run where tfdtape cannot make them the
  same on every worker (`check_single_worker`);
- on several workers, values that are not the same on every worker
  (`check_apply`, through `tfdtape.worker_agreement`);
- a total over the replicas all-reduced again inside strategy.run, as an
  optimizer applying it there does (`check_no_total`).
"""

import typing

from tensorflow.python.distribute import values
from tensorflow.python.framework import indexed_slices
from tensorflow.python.util import nest

from tfdtape import compat
from tfdtape import component_totals
from tfdtape import errors
from tfdtape import events
from tfdtape import resolution
from tfdtape import worker_agreement
from tfdtape import workers

MERGE_CALL_SYMBOL = "tf.__internal__.distribute.interim.maybe_merge_call"
"""What an optimizer's apply goes through, named in the refusals."""


CROSS_REPLICA = "in cross-replica context"
OUTSIDE_THEIR_SCOPE = "outside their strategy's scope"


def check_no_per_replica_values(args, kwargs, symbol=MERGE_CALL_SYMBOL,
                                where=CROSS_REPLICA):
    """Raises ValueError if the arguments hold PerReplica values: applied in
    cross-replica context (`where`: CROSS_REPLICA), each replica's copy would
    get its own value, and the replicas would drift apart (in replica
    context `merge_call` would have all-reduced them); outside every
    strategy's scope (OUTSIDE_THEIR_SCOPE) the default strategy has no
    replicas to give them to."""
    found = [value for value in nest.flatten((args, kwargs))
             if isinstance(value, values.PerReplica)]
    if found:
        raise events.refused(ValueError(errors.message(
            f"cannot apply per-replica values {where}", symbol,
            "values the same for every replica, such as the gradient of a tape "
            "around strategy.run, or values reduced with strategy.reduce",
            f"{len(found)} PerReplica value{'' if len(found) == 1 else 's'} "
            "(what strategy.run returns), which would update each replica's "
            "copy with its own value and let the replicas drift apart",
            "Apply inside the function you pass to strategy.run (the optimizer "
            "all-reduces there), or reduce the values first")))


def distributed_variables(structure):
    """The distributed variables in `structure` (an apply's arguments)."""
    return [value for value in nest.flatten(structure)
            if resolution.is_distributed_variable(value)]


def check_strategies(made_in, current, variables, symbol=MERGE_CALL_SYMBOL):
    """Raises ValueError where an apply would update `variables` (the
    distributed variables it is given) other than every copy alike:

    - the optimizer was made outside every scope (`made_in` is the default
      strategy) and a variable has several replicas: its state (Adam's
      moments) is one variable each copy's update would advance in turn;
    - in `current`'s scope (a strategy's, in cross-replica context), the
      optimizer was made in another strategy's (`made_in`), or a variable
      belongs to another strategy: `current`'s updates do not reach their
      copies.

    `made_in` None (not an optimizer's apply) is not checked.
    """
    if made_in is None:
        return
    default = compat.strategy_context._get_default_strategy()
    several = [variable for variable in variables
               if variable.distribute_strategy.num_replicas_in_sync > 1]
    if made_in is default and several:
        holder = type(several[0].distribute_strategy).__name__
        raise events.refused(ValueError(errors.message(
            "cannot apply with an optimizer made outside strategy.scope()", symbol,
            f"an optimizer made inside `with strategy.scope():` of the {holder} "
            "that holds the variables",
            "one made outside every scope, whose state (such as Adam's moments) "
            "is one variable that every replica's copy would update in turn, "
            "letting the copies drift apart",
            f"Make the optimizer inside the {holder}'s scope, as the model")))
    if current is default:
        return
    if made_in is not current and made_in is not default:
        raise events.refused(ValueError(errors.message(
            "cannot apply gradients in another strategy's scope", symbol,
            f"the scope of the strategy the optimizer was made in "
            f"({type(made_in).__name__}), or no scope",
            f"the scope of another {type(current).__name__}, whose updates do not "
            "reach the variables' copies",
            f"Apply inside `with strategy.scope():` of the {type(made_in).__name__} "
            "that made the optimizer and the variables")))
    foreign = [variable for variable in variables
               if variable.distribute_strategy is not current]
    if foreign:
        holder = type(foreign[0].distribute_strategy).__name__
        raise events.refused(ValueError(errors.message(
            "cannot apply gradients in another strategy's scope", symbol,
            f"the scope of the strategy the variables were made in ({holder}), "
            "or no scope",
            f"{foreign[0].name!r} of a {holder} updated in the scope of another "
            f"{type(current).__name__}, whose updates do not reach its copies",
            f"Apply inside `with strategy.scope():` of the {holder} that made "
            "the variables (and make the optimizer there too)")))


def check_single_worker(strategy, symbol, what):
    """Raises ValueError if `strategy` spans several workers.

    Args:
        strategy: the strategy of the cross-replica computation.
        symbol: the API the user called, named in the message.
        what: what cannot be done, e.g. "cannot apply gradients".
    """
    if not workers.in_multi_worker_mode(strategy):
        return
    raise events.refused(ValueError(errors.message(
        f"{what} outside strategy.run under several workers", symbol,
        "a call inside strategy.run, or a strategy of one worker",
        f"a call outside strategy.run under a {type(strategy).__name__} in "
        "multi-worker mode (MultiWorkerMirroredStrategy), where a gradient "
        "covers this worker's replicas only and the workers would drift apart",
        "Compute and apply the gradients inside strategy.run, where they are "
        "all-reduced across workers")))


def check_no_total(replicas, value, symbol):
    """Raises ValueError where `value`, all-reduced inside the replicas of
    a strategy of several (`replicas` in sync), holds a total over the
    replicas (the gradient of a tape around strategy.run:
    `component_totals.made_of_total`), as an optimizer applying it inside
    strategy.run does: TensorFlow would add up every replica's (and every
    worker's) copy of it."""
    if replicas > 1 and component_totals.made_of_total(value):
        raise events.refused(ValueError(errors.message(
            "cannot all-reduce a total over the replicas again", symbol,
            "values computed inside the replicas",
            "the gradient of a tape around strategy.run (already the sum "
            "over every replica and worker), or what was computed from it, "
            "all-reduced inside strategy.run, as an optimizer applying it "
            "there does; every replica's copy would be added up",
            "Apply that gradient in cross-replica context: call "
            "optimizer.apply_gradients outside strategy.run")))


def check_apply(strategy, args, kwargs):
    """(args, kwargs) of a `maybe_merge_call` in cross-replica context under
    `strategy` (several workers), with every floating tensor in them that
    is not a total `tape.gradient` all-reduced across the workers checked
    to be the same on every worker (`checked`).

    Raises:
        ValueError: eagerly, such a tensor differs between workers; named by
            the variable it is paired with, where it is.
    """
    unknown = [found for found in _floating_tensors((args, kwargs))
               if not component_totals.is_total(found.tensor)]
    if not unknown:
        return args, kwargs

    def refusal(index):
        label = unknown[index].label
        return events.refused(ValueError(errors.message(
            "cannot apply values that differ between workers", MERGE_CALL_SYMBOL,
            "values the same on every worker, such as the gradient a tape "
            "around strategy.run takes (all-reduced across the workers)",
            f"{label} differing between workers, which would update each "
            "worker's copies with what that worker computed alone and let the "
            "workers drift apart",
            "Apply the gradients tape.gradient returns (and what you compute "
            "from them alone), or apply inside the function you pass to "
            "strategy.run, where the optimizer all-reduces them")))

    agreed = worker_agreement.checked(strategy, [found.tensor for found in unknown],
                                      refusal)
    replaced = dict(zip([found.path for found in unknown], agreed))
    flat = nest.flatten_with_tuple_paths((args, kwargs))
    return nest.pack_sequence_as((args, kwargs), [
        replaced.get(path, value) for path, value in flat])


class _Labelled(typing.NamedTuple):
    """A floating tensor in an apply's arguments: where it is (a
    `nest.flatten_with_tuple_paths` path), itself, and how a message names
    it."""
    path: tuple
    tensor: object
    label: str


def _floating_tensors(structure):
    """A `_Labelled` for each floating tensor or IndexedSlices in
    `structure`: the label names the variable a (gradient, variable) pair
    pairs it with, else its position."""
    flat = nest.flatten_with_tuple_paths(structure)
    by_path = dict(flat)
    found = []
    for path, value in flat:
        if not _is_floating(value):
            continue
        partner = by_path.get(path[:-1] + (1,)) if path and path[-1] == 0 else None
        if partner is not None and _is_variable(partner):
            label = f"the gradient for {partner.name!r}"
        else:
            label = "the value at " + "".join(f"[{step!r}]" for step in path)
        found.append(_Labelled(path, value, label))
    return found


def _is_floating(value):
    if isinstance(value, indexed_slices.IndexedSlices):
        return value.dtype.is_floating
    return isinstance(value, compat.Tensor) and value.dtype.is_floating


def _is_variable(value):
    return (resolution.is_distributed_variable(value) or
            hasattr(value, "assign") and hasattr(value, "name"))
