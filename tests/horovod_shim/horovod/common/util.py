"""`horovod.common.util`'s version comparison, which Horovod's Keras test
file imports."""

from packaging import version


def is_version_greater_equal_than(ver, target):
    """Whether version string `ver` is `target` or later."""
    return version.parse(ver) >= version.parse(target)
