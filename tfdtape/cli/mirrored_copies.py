"""Whether a mirrored variable's copies still agree, for `python -m tfdtape
run`'s report.

A mirrored variable (MirroredStrategy, MultiWorkerMirroredStrategy: written
alike on every replica) holds one copy per local device. A program that
updates one replica's copy (an assign inside `strategy.run` with the wrong
aggregation, an optimizer that steps each copy with its own state) leaves
copies that differ, and each replica then trains another model: the
first thing to rule out when a multi-replica run diverges where one device
does not. Sync-on-read variables (metrics, BatchNormalization's statistics
under some strategies) differ by design and are not compared.

`differing_copies(variable)` reads every local copy (device to host, once
each) and compares them with the first; the run command asks it of every
mirrored variable its recorder saw that is still alive at the end.
"""

import dataclasses

import numpy as np
from tensorflow.python.framework import ops
from tensorflow.python.ops import variables

from tfdtape import resolution


@dataclasses.dataclass(frozen=True)
class Difference:
    """How far a mirrored variable's copies are apart.

    Attributes:
        largest: the largest absolute difference of an element between the
            first copy and another (inf where one is NaN and the other not).
        copy: the index of the copy that differs most from the first.
        devices: (the first copy's device, that copy's device).
    """
    largest: float
    copy: int
    devices: tuple[str, str]

    def describe(self):
        """E.g. 'copies 0 and 2 differ by up to 0.0125 (/device:CPU:0, /device:CPU:2)'."""
        return (f"copies 0 and {self.copy} differ by up to {self.largest:.3g} "
                f"({self.devices[0]}, {self.devices[1]})")


def is_mirrored(variable):
    """Whether `variable` is a distributed variable written alike on every
    replica (not sync-on-read), with more than one local copy."""
    return (resolution.is_distributed_variable(variable) and
            variable.synchronization != variables.VariableSynchronization.ON_READ and
            len(getattr(variable, "values", ())) > 1)


def differing_copies(variable):
    """The `Difference` of a mirrored variable whose local copies are not
    all equal (NaNs in the same places count as equal), else None."""
    with ops.init_scope():  # eager reads, whatever graph is being built
        copies = [np.asarray(component.read_value()) for component in variable.values]
    first = copies[0]
    worst = None
    for index, other in enumerate(copies[1:], start=1):
        largest = _largest_difference(first, other)
        if largest > 0 and (worst is None or largest > worst[0]):
            worst = (largest, index)
    if worst is None:
        return None
    return Difference(worst[0], worst[1],
                      (variable.values[0].device, variable.values[worst[1]].device))


def _largest_difference(first, other):
    if first.dtype.kind not in "fc":
        return float(np.max(np.abs(first.astype(np.float64) - other.astype(np.float64)),
                            initial=0.0))
    one_nan = np.isnan(first) != np.isnan(other)
    if np.any(one_nan):
        return float("inf")
    both_finite = ~np.isnan(first)
    return float(np.max(np.abs(first[both_finite] - other[both_finite]), initial=0.0))
