"""The TensorFlow releases tfdtape supports, kept in one place.

`setup.py` builds its extras from `TENSORFLOW_REQUIREMENT`, and `install()`
checks the running TensorFlow against the same bounds, so the two cannot
disagree. This module must not import TensorFlow.
"""

import re

RELEASE = "0.1.0"
"""This tfdtape release."""

MINIMUM_TENSORFLOW = (2, 12)
"""Oldest supported TensorFlow release (major, minor), inclusive."""

BEYOND_TENSORFLOW = (2, 22)
"""First TensorFlow release (major, minor) not yet supported, exclusive."""

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


def is_supported(version):
    """True when the TensorFlow `version` string lies in the supported range."""
    return MINIMUM_TENSORFLOW <= parse_release(version) < BEYOND_TENSORFLOW
