"""The TensorFlow releases tfdtape supports, kept in one place.

`setup.py` builds its extras from `TENSORFLOW_REQUIREMENT`, and `install()`
checks the running TensorFlow against the same bounds, so the two cannot
disagree. Final releases inside the bounds are the tested ones; any other
TensorFlow (older, newer, a development build or a pre-release) is untested,
and `install()` refuses it unless TFDTAPE_ALLOW_UNTESTED_TENSORFLOW=1 (see
`tfdtape.patching`). This module must not import TensorFlow.
"""

import re

RELEASE = "0.1.0"
"""This tfdtape release."""

MINIMUM_TENSORFLOW = (2, 12)
"""Oldest tested TensorFlow release (major, minor), inclusive."""

BEYOND_TENSORFLOW = (2, 22)
"""First TensorFlow release (major, minor) not yet tested, exclusive."""

TENSORFLOW_REQUIREMENT = ">={}.{},<{}.{}".format(*MINIMUM_TENSORFLOW,
                                                   *BEYOND_TENSORFLOW)
"""The pip version specifier for tensorflow / tensorflow-cpu."""


def parse_release(version):
    """Returns (major, minor) of a version string such as '2.21.0' or '2.16.0rc1'.

    Raises:
        ValueError: the string does not start with two dot-separated integers.
    """
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"not a TensorFlow version string: {version!r}")
    return int(match.group(1)), int(match.group(2))


def untested_reason(version):
    """Why the TensorFlow `version` string is not a release tfdtape was tested
    on ('a development build', 'newer than the tested range', ...), or None
    for a final release inside MINIMUM_TENSORFLOW .. BEYOND_TENSORFLOW.
    """
    try:
        release = parse_release(version)
    except ValueError:
        return "not a release number"
    reasons = []
    if re.search(r"dev|nightly", version):
        reasons.append("a development build")
    elif not re.fullmatch(r"\d+\.\d+\.\d+", version):
        reasons.append("a pre-release")
    if release < MINIMUM_TENSORFLOW:
        reasons.append("older than the tested range")
    elif release >= BEYOND_TENSORFLOW:
        reasons.append("newer than the tested range")
    return ", ".join(reasons) or None


def is_tested(version):
    """True when the TensorFlow `version` string is a final release inside
    the tested range."""
    return untested_reason(version) is None


TESTED_RANGE_TEXT = f"final releases {TENSORFLOW_REQUIREMENT}"
"""The tested range, in words for messages."""
