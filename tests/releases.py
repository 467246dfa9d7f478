"""What each TensorFlow release does where a test pins a control's
behaviour (the exception stock or pre-seed TensorFlow raises), stated per
release instead of assumed."""

import tensorflow as tf

from tfdtape import versions

RELEASE = versions.parse_release(tf.__version__)
"""The running TensorFlow as (major, minor); a nightly counts as its release."""

HANDLE_UNAVAILABLE = ("DistributedVariable.handle is not available outside "
                      "the replica context")
C_CALL_FAILED = "returned a result with an exception set"


def unresolved_container_error(call):
    """(exception type, start of its message) that TensorFlow's C tape raises
    when `call` ("watch_variable", "variable_accessed" or
    "variables_accessed") hands it a distributed container in cross-replica
    context with no resolver in between (pre_seed).

    Up to 2.22 each call leaves the handle ValueError set inside the C call,
    which Python reports as SystemError. From 2.23 TFE_Py_TapeWatchVariable
    raises that ValueError itself; the read calls still give SystemError.
    """
    if call == "watch_variable" and RELEASE >= (2, 23):
        return ValueError, HANDLE_UNAVAILABLE
    return SystemError, "<built-in method "


def empty_collectives_end_the_process():
    """Whether stock TensorFlow's collectives end the process with SIGSEGV
    on a tensor of no elements (tfdtape.empty_collectives): an all-gather,
    and MultiWorkerMirroredStrategy's broadcast of a new variable's initial
    value made from NumPy; measured on 2.21 and the pinned 2.23 nightly
    (they do), and on 2.12.1 (both transfer the tensor); None for the
    releases between, not measured."""
    if RELEASE >= (2, 21):
        return True
    if RELEASE <= (2, 12):
        return False
    return None
