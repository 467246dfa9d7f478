"""The rule for the version stages (tests/release_selection.py) and its
proof: the tests it keeps run every patch target and read every compat
accessor on the release they run on.

The proof (`exercise_proof`) reads what `pytest --per-release
--record-exercise DIR` recorded (tests/exercise_recorder.py) and runs only
when given `--exercised-data DIR`, as tools/matrix.py --per-release does
after the version stage's tests; the rest checks the rule's and the
recorder's machinery on made-up tests and modules.
"""

import importlib
import json
import sys
import textwrap
import traceback
import types

import pytest
import tensorflow as tf

import exercise_recorder
import release_selection


class Case:
    """A stand-in for a pytest item: a node id and a parametrization."""

    def __init__(self, nodeid, marked=True, **params):
        """`marked`: True (per_release), False (per_release(False), a
        module's mark taken back) or None (no mark)."""
        self.nodeid = nodeid
        self.callspec = types.SimpleNamespace(params=params) if params else None
        self.marked = marked

    def get_closest_marker(self, name):
        if self.marked is None or name != release_selection.MARKER:
            return None
        return pytest.mark.per_release(False).mark if self.marked is False else (
            pytest.mark.per_release.mark)

    def __repr__(self):
        return self.nodeid


def cases(function, **values):
    """Every combination of `values` ({parameter: count of values}) of
    `function`, the values numbered."""
    made = [{}]
    for parameter, count in values.items():
        made = [dict(case, **{parameter: index}) for case in made for index in range(count)]
    return [Case(f"{function}[{'-'.join(map(str, case.values()))}]", **case)
            for case in made]


def test_each_choice_takes_every_value_of_every_parameter_in_few_cases():
    grid = cases("t.py::test", configuration=4, style=6, optimizer=2)
    kept = release_selection.each_choice(grid)
    assert len(kept) == 6
    for parameter, count in (("configuration", 4), ("style", 6), ("optimizer", 2)):
        assert {case.callspec.params[parameter] for case in kept} == set(range(count))
    assert kept == [case for case in grid if case in kept]  # collection order


def test_select_keeps_marked_tests_and_thins_each_function_apart():
    marked = cases("t.py::test_a", configuration=4, traced=2)
    alone = Case("t.py::test_b")
    unmarked = [Case("t.py::test_c", marked=None),
                Case("t.py::test_e", marked=False),
                *[Case(f"t.py::test_d[{i}]", marked=None, mode=i) for i in range(3)]]
    kept, deselected = release_selection.select(marked + [alone] + unmarked)
    assert len(kept) == 5 and kept[-1] is alone
    assert {case.callspec.params["configuration"] for case in kept[:4]} == {0, 1, 2, 3}
    assert {case.callspec.params["traced"] for case in kept[:4]} == {0, 1}
    assert set(deselected) == set(marked + [alone] + unmarked) - set(kept)


MADE_UP = '''
"""A module of made-up functions."""

import functools


def plain(x):
    """Doubles."""
    return 2 * x


def make_closure(original):
    @functools.wraps(original)
    def replacement(*args):
        return original(*args) + 1
    return replacement


class Base:
    def method(self):
        return "base"


class Derived(Base):
    def method(self):
        return "derived of " + super().method()

    @property
    def value(self):
        return 3

    @staticmethod
    def static():
        return 4


def fails():
    raise ValueError("from fails")


ALIAS = plain
'''


@pytest.fixture
def made_up(tmp_path, monkeypatch):
    """A fresh module of MADE_UP, instrumented; the recorder's hits emptied."""
    (tmp_path / "made_up_module.py").write_text(textwrap.dedent(MADE_UP))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("made_up_module", None)
    module = importlib.import_module("made_up_module")
    monkeypatch.setattr(exercise_recorder, "hits", set())
    original_codes = {name: getattr(module, name).__code__
                      for name in ("plain", "make_closure", "fails")}
    assert exercise_recorder.instrument([module]) == 7
    yield module, original_codes
    sys.modules.pop("made_up_module", None)


def key_of(code):
    return exercise_recorder.code_key(code)


def test_instrumented_functions_record_when_they_run_and_only_then(made_up):
    module, original_codes = made_up
    assert exercise_recorder.hits == set()
    assert module.plain(4) == 8 and module.plain.__doc__ == "Doubles."
    assert module.ALIAS is module.plain
    assert exercise_recorder.hits == {key_of(original_codes["plain"])}
    derived = module.Derived()
    assert (derived.method(), derived.value, derived.static()) == ("derived of base", 3, 4)
    assert {key.rsplit(":", 1)[1] for key in exercise_recorder.hits} == {
        "plain", "method", "value", "static"}


def test_closures_made_after_instrumenting_record_under_their_own_key(made_up):
    module, original_codes = made_up
    replacement = module.make_closure(len)
    assert exercise_recorder.hits == {key_of(original_codes["make_closure"])}
    assert replacement("abc") == 4 and replacement.__name__ == "len"
    assert key_of(replacement.__code__) in exercise_recorder.hits
    assert key_of(replacement.__code__).endswith(":replacement")


def test_tracebacks_keep_the_functions_lines(made_up):
    module, original_codes = made_up
    with pytest.raises(ValueError) as caught:
        module.fails()
    frame = traceback.extract_tb(caught.value.__traceback__)[-1]
    assert (frame.name, frame.line) == ("fails", 'raise ValueError("from fails")')
    assert frame.lineno == original_codes["fails"].co_firstlineno + 1


def test_reads_of_a_watched_module_are_recorded(made_up, monkeypatch):
    module, _ = made_up
    monkeypatch.setattr(exercise_recorder, "reads", set())
    exercise_recorder.watch_reads(module)
    assert module.ALIAS(1) == 2
    assert ("made_up_module", "ALIAS") in exercise_recorder.reads
    assert ("made_up_module", "Derived") not in exercise_recorder.reads


def test_compats_accessors_are_the_names_it_binds_for_either_release():
    from tfdtape import compat
    assert exercise_recorder.accessors(compat) == [
        "EAGER_SPARSE_ALL_REDUCE", "HAS_RESOLVER_REGISTRY", "Tensor", "cond",
        "graph_assert", "recording_module", "stack", "stop_recording", "strategy_context"]


def records(directory):
    files = sorted(directory.glob("*.json"))
    assert files, f"no records in {directory} (pytest --record-exercise writes them)"
    return [json.loads(path.read_text(encoding="utf-8")) for path in files]


@pytest.mark.exercise_proof
def test_the_version_stages_run_every_patch_target_and_compat_accessor(request):
    found = records(request.config.getoption("exercised_data"))
    assert {record["tensorflow"] for record in found} == {tf.__version__}
    hits = set().union(*(record["hits"] for record in found))
    reads = set().union(*(record["compat_reads"] for record in found))
    unexercised = {}
    for table in ("targets", "scoped_targets"):
        every = {symbol: key for record in found for symbol, key in record[table].items()}
        unexercised[table] = sorted(symbol for symbol, key in every.items()
                                    if key not in hits)
        assert every, f"no {table} recorded"
    unexercised["compat accessors"] = sorted(set(found[0]["compat_accessors"]) - reads)
    assert not any(unexercised.values()), (
        f"on TensorFlow {tf.__version__} no test the version stages run "
        f"(marked {release_selection.MARKER}) ran these: {unexercised}")
