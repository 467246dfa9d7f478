"""Assertions on identity, since tf.Variable's == compares values elementwise."""


def assert_same_objects(found, expected):
    """Asserts `found` holds exactly the objects of `expected`, in order."""
    found, expected = list(found), list(expected)
    assert len(found) == len(expected), (
        f"expected {len(expected)} objects {_names(expected)}, "
        f"found {len(found)} {_names(found)}")
    for index, (f, e) in enumerate(zip(found, expected)):
        assert f is e, (f"item {index}: expected {_name(e)}, found {_name(f)}")


def _name(obj):
    return f"{type(obj).__name__}({getattr(obj, 'name', '?')} on {getattr(obj, 'device', '?')})"


def _names(objs):
    return "[" + ", ".join(_name(o) for o in objs) + "]"
