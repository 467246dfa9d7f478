"""The rule for what the version stages run (`pytest --per-release`): the
tests marked `per_release`, each parametrized test thinned to the cases that
take every value of every parameter at least once.

A test is marked `per_release` when its outcome can depend on the
TensorFlow or Keras release: it runs through a patch target, `compat`,
`versions`, a Keras 2 / tf_keras path, the Horovod layer's TensorFlow calls
or the multi-worker machinery. The closest mark counts: a test (or one
case, `pytest.param(..., marks=pytest.mark.per_release(False))`) takes its
module's mark back where another test or case already runs the same path
on every release and this one would only repeat it at a cost (more workers,
a stock control, the command line around it). The full suite runs once, on the newest
release, with every case; on the other releases (tools/matrix.py
--per-release) every configuration, every Keras, every optimizer ... of a
marked test is still tried, not every combination of them.
`tests/test_release_rule.py` proves that these cases run every patch target
and read every compat accessor on the release they run on.
"""

MARKER = "per_release"


def each_choice(items):
    """The items to keep of one test function's cases: greedily, the case
    taking the most parameter values not yet taken, until every value of
    every parameter is taken; collection order breaks ties."""
    untaken = {choice for item in items for choice in _choices(item)}
    kept = []
    while untaken:
        best = max(items, key=lambda item: len(_choices(item) & untaken))
        kept.append(best)
        untaken -= _choices(best)
    return [item for item in items if item in kept]


def _choices(item):
    """(parameter, its value) of a case (the value's identity where it cannot
    be hashed); none for an unparametrized test."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return set()
    return {(name, _hashable(value)) for name, value in callspec.params.items()}


def _hashable(value):
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))
    return value


def is_marked(item):
    """Whether the closest `per_release` mark of `item` keeps it."""
    mark = item.get_closest_marker(MARKER)
    return mark is not None and (not mark.args or bool(mark.args[0]))


def select(items):
    """(kept, deselected): the marked tests, each function's cases thinned
    by `each_choice`."""
    by_function = {}
    deselected = []
    for item in items:
        if not is_marked(item):
            deselected.append(item)
        else:
            by_function.setdefault(item.nodeid.partition("[")[0], []).append(item)
    kept = set()
    for cases in by_function.values():
        kept.update(each_choice(cases) if len(cases) > 1 else cases)
    deselected += [item for cases in by_function.values() for item in cases
                   if item not in kept]
    return [item for item in items if item in kept], deselected
