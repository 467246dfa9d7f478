"""`python -m tfdtape info`: versions, TensorFlow's own resolution, the job
the launcher started this process in, and who holds each patch target
now."""

import platform

from tfdtape import switches
from tfdtape.cli import command_line


def run(args):
    """Prints the report; returns the exit status."""
    del args
    tf = command_line.import_tensorflow()
    command_line.import_internals(tf, "captured_inputs", "patching", "targets", "testing")
    from tfdtape import captured_inputs
    from tfdtape import compat
    from tfdtape import errors
    from tfdtape import patching
    from tfdtape import release_policy
    from tfdtape import targets
    from tfdtape import testing
    from tfdtape import versions
    print(f"tfdtape {versions.RELEASE} (tested on TensorFlow "
          f"{versions.TESTED_RANGE_TEXT})")
    print(f"TensorFlow {tf.__version__}, Python {platform.python_version()}")
    untested = release_policy.untested_line(tf.__version__)
    if untested:
        print(f"{untested}: install() refuses it unless "
              f"{switches.ALLOW_UNTESTED_TENSORFLOW}=1 "
              f"({_opt_in_text(release_policy)})")
    print(f"TensorFlow's native resolver: "
          f"{testing.native_resolution_description()}"
          + (" (one-shot hook, no unregister)" if compat.HAS_RESOLVER_REGISTRY
             else ""))
    resolving = captured_inputs.classes_with_captured_input_resolution()
    print("defun captured-input resolution: " + (
        ", ".join(cls.__qualname__ for cls in resolving) if resolving
        else "absent (removed upstream, as the commit did)"))
    print(f"job: {job_text()}")
    installed = patching.is_installed()
    print(f"installed in this process: {'yes' if installed else 'no'}"
          " (`import tfdtape` installs)")
    try:
        patching.preflight()
        print("install check: OK")
    except (errors.UnsupportedTensorFlowError, errors.PatchConflictError,
            ValueError) as error:  # ValueError: an unreadable opt-in
        print(f"install check: FAILED: {error}")
    print("patch targets (who holds each now, judged by identity):")
    for target in targets.patch_targets():
        print(f"  {target.symbol}: {_holder_text(target, targets)}")
    print("scoped patch targets (held while `python -m tfdtape run` runs; "
          "--no-install: the observers):")
    for target in scoped_patch_targets():
        if target.holder() != targets.MISSING:
            print(f"  {target.symbol}: {_holder_text(target, targets)}")
    return command_line.EXIT_PASSED


def job_text():
    """The job this process's launcher started it in, as tfdtape reads it
    (`tfdtape.launchers.find_job`), or why it cannot be one."""
    from tfdtape import launchers
    try:
        found = launchers.find_job()
    except (launchers.JobFormationError, ValueError) as error:
        return f"cannot be formed: {error}"
    if found is None:
        return f"this process alone (no launcher of several processes; " \
               f"{switches.INDEPENDENT_PROCESSES} " \
               f"{'set' if _independent() else 'not set'})"
    return found.describe()


def _independent():
    try:
        return switches.read(switches.INDEPENDENT_PROCESSES, False, "")
    except ValueError:
        return False


def scoped_patch_targets():
    """Every target the run command holds for a block (`targets.scoped()`):
    its observers, the MEAN trap's, the clipping warning's and the one-device
    Keras distribution's."""
    from tfdtape.cli import one_device_distribution
    from tfdtape.cli import replica_clipping
    from tfdtape.cli import scale_traps
    from tfdtape.cli import stock_observers
    return (stock_observers.observer_targets() +
            scale_traps.average_loss_targets() +
            replica_clipping.clipping_targets() +
            one_device_distribution.build_targets())


def _opt_in_text(release_policy):
    """Whether the untested-release opt-in is set, in words."""
    try:
        return "set" if release_policy.untested_accepted() else "not set"
    except ValueError:
        return "set to a value not understood"


def _holder_text(target, targets):
    holder = target.holder()
    if holder == targets.TFDTAPE:
        return "tfdtape's replacement"
    if holder == targets.SCOPED:
        return "tfdtape's scoped replacement (python -m tfdtape run)"
    if holder == targets.TENSORFLOW:
        owner = getattr(target.owner, "__module__", None) or target.owner.__name__
        return ("TensorFlow's original" if owner.partition(".")[0] == "tensorflow"
                else f"{owner.partition('.')[0]}'s original")
    if holder == targets.MISSING:
        return "missing"
    return f"another library's patch ({targets.describe(target.current())})"
