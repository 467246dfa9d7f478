"""Whether a strategy spans several workers (MultiWorkerMirroredStrategy in
multi-worker mode): the one question every module that treats several
workers apart asks, in the three forms it has at hand.

On several workers a gradient tfdtape computes outside the replicas covers
this worker's replicas only; it is all-reduced across the workers
(`tfdtape.worker_totals`), and an apply checks that what it applies is the
same on every worker (`tfdtape.apply_checks`).
"""

from tfdtape import resolution


def in_multi_worker_mode(strategy):
    """Whether `strategy` spans several workers."""
    check = getattr(strategy.extended, "_in_multi_worker_mode", None)
    return check is not None and check()


def of_several_workers(variable):
    """Whether `variable` is a distributed variable of a strategy of several
    workers (its gradient is all-reduced across them)."""
    return (resolution.is_distributed_variable(variable) and
            in_multi_worker_mode(variable.distribute_strategy))


def extended_of_several_workers(extended):
    """Whether the strategy whose `StrategyExtended` is `extended` spans
    several workers."""
    return in_multi_worker_mode(extended._container_strategy())
