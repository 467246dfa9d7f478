"""Which TensorFlow releases tfdtape goes into: the untested-release policy.

A final release inside the tested range (`tfdtape.versions`) is accepted.
Any other TensorFlow (older, newer, a development build such as tf-nightly,
a pre-release) is refused by default, so a program does not run on a patch
nobody checked there. TFDTAPE_ALLOW_UNTESTED_TENSORFLOW=1 opts in; so does
`accept_untested()`, which `python -m tfdtape verify` calls because checking
the patch against a build is its job. Opting in lifts only the release check:
`install()` still checks every function it patches before patching.

This module must not import TensorFlow: `python -m tfdtape run` applies the
policy before it imports tfdtape's TensorFlow-facing modules.
"""

from tfdtape import errors
from tfdtape import process_state
from tfdtape import switches
from tfdtape import versions

# Kept across importlib.reload: an acceptance made in this process stays.
_accepted_here = process_state.kept(globals(), "_accepted_here", bool)


def accept_untested():
    """Accepts an untested TensorFlow in this process, as the opt-in would,
    for a caller that reports the release as untested itself (so install()
    logs no WARNING)."""
    global _accepted_here
    _accepted_here = True


def reported_elsewhere():
    """Whether `accept_untested()` was called: its caller tells the user."""
    return _accepted_here


def untested_accepted():
    """Whether this process accepts an untested TensorFlow.

    Raises:
        ValueError: TFDTAPE_ALLOW_UNTESTED_TENSORFLOW holds a word not
            understood.
    """
    return _accepted_here or switches.read(
        switches.ALLOW_UNTESTED_TENSORFLOW, False,
        "Set it to 1 to install tfdtape on an untested TensorFlow release")


def refusal(version):
    """The message of the UnsupportedTensorFlowError refusing TensorFlow
    `version`, or None when tfdtape may go into it.

    Raises:
        ValueError: as `untested_accepted()`.
    """
    reason = versions.untested_reason(version)
    if reason is None or untested_accepted():
        return None
    return errors.message(
        "untested TensorFlow release", "tensorflow.__version__",
        versions.TESTED_RANGE_TEXT, f"{version} ({reason})",
        f"Install tensorflow-cpu{versions.TENSORFLOW_REQUIREMENT} (or "
        f"tensorflow), or set {switches.ALLOW_UNTESTED_TENSORFLOW}=1 to install "
        "on this release anyway (tfdtape still checks every function it "
        "patches first; `python -m tfdtape verify` tells whether the patch "
        "holds there)")


def untested_line(version):
    """One line saying TensorFlow `version` is untested, or None if tested."""
    reason = versions.untested_reason(version)
    if reason is None:
        return None
    return (f"TensorFlow {version} is untested ({reason}; tested: "
            f"{versions.TESTED_RANGE_TEXT})")
