"""Generated programs against an oracle that knows nothing of tfdtape.

One subprocess per device layout (1, 2 and 4 virtual CPUs) runs the
programs `generated_programs.generate` draws for the seed, each on stock
TensorFlow, with tfdtape and with tfdtape alone; the test fails on any
outcome but "right", "clear_error" (tfdtape's own) and
"stock_fails_alike" (TensorFlow's error, raised alike on stock), listing the failing programs (and,
shrunk, the fewest choices that still fail) as specs that
`generated_programs_process.py --program SPEC` replays. The counts per
outcome and per dimension are printed (`pytest -s`).

The seed and the number of programs per layout are CI's by default;
`--fuzz-cases N` / `--fuzz-seed S` (or TFDTAPE_FUZZ_CASES and
TFDTAPE_FUZZ_SEED) run longer searches by hand.
"""

import dataclasses

import pytest

import generated_programs as gp

pytestmark = pytest.mark.per_release

CI_SEED = 22
CI_CASES = 120
"""Programs per layout in CI: about 40 s of a subprocess each."""
RELEASE_SEARCH = (CI_SEED, 40)
"""(seed, programs per layout) in the version stages (--per-release): the
first 40 of CI's."""
LAYOUTS = (1, 2, 4)
TIME_LIMIT = 1800


@pytest.mark.parametrize("devices", LAYOUTS, ids=lambda d: f"{d}_cpus")
def test_generated_programs_give_the_right_value_or_a_clear_error(
        request, devices):
    seed, cases = gp.search_size(request.config, (CI_SEED, CI_CASES), RELEASE_SEARCH)
    records = gp.run_generator("generated_programs_process.py", devices, seed, cases,
                               TIME_LIMIT)
    assert len(records) == cases
    refused_values = sum(r["outcome"] != "right" and r["expected"] != gp.REFUSE
                         for r in records)
    print("\n" + gp.outcome_summary(
        records, f"programs on {devices} virtual CPU(s)", gp.DIMENSIONS,
        notes=[f"  errors where the oracle has a value: {refused_values}"]))
    failing = gp.failures(records)
    assert not failing, failing
    if devices > 1:  # The search tells stock from tfdtape.
        assert any(map(gp.stock_wrong, records))


def test_the_oracle_works_the_sum_over_replicas_out_on_one_device():
    program = gp.Program(**gp.SIMPLEST)  # a tape around an eager run, SUM
    assert gp.oracle(program, 4) == {"gradient": 90.0}  # Σ 2 (r+1)² 1.5
    mean = gp.Program(**dict(gp.SIMPLEST, target="reduce_mean", extra_read=True,
                             nested=True, unconnected="zero_extra"))
    assert gp.oracle(mean, 2) == {"gradient": [7.5 + 3.0, 0.0],
                                  "second_order": 5.0}
    on_read = gp.Program(**dict(gp.SIMPLEST, variable="on_read_sum"))
    assert gp.oracle(on_read, 2) == gp.REFUSE
    assert gp.oracle(dataclasses.replace(on_read, scope="none"), 1) == {
        "gradient": 3.0}  # One component: no share.
    replica = gp.Program(**dict(gp.SIMPLEST, tape="in_replica", step="sgd"))
    assert gp.oracle(replica, 2) == {"gradient": [3.0, 12.0],
                                     "weights": 1.5 - 0.125 * 15.0}


def test_the_oracle_works_the_collectives_out_on_one_device():
    """On 2 replicas (x = 1, 2; v = 1.5): z_r times the all-reduced sum S of
    z adds up to S² = 9 v² (gradient 27), its MEAN to 13.5, times the
    gathered z weighted by x to S (v sum x²) = 15 v² (gradient 45). A tape
    inside replica r gets x_r sum(x²) v + x_r² S for the gather."""
    def program(collective, **choices):
        return gp.Program(**dict(gp.SIMPLEST, collective=collective, **choices))

    assert gp.oracle(program("all_reduce_sum"), 2) == {"gradient": 27.0}
    assert gp.oracle(program("all_reduce_mean"), 2) == {"gradient": 13.5}
    assert gp.oracle(program("all_gather", nested=True), 2) == {
        "gradient": 45.0, "second_order": 30.0}
    assert gp.oracle(program("all_gather", tape="in_replica"), 2) == {
        "gradient": [1.5 * (5.0 + 3.0), 1.5 * (10.0 + 12.0)]}
    assert gp.oracle(program("all_reduce_sum", tape="in_replica", step="sgd"), 2) == {
        "gradient": [9.0, 18.0], "weights": 1.5 - 0.125 * 27.0}
    assert gp.pinned(program("all_gather", tape="direct")).collective == "none"


@pytest.mark.parametrize("stock, found, alone, outcome", [
    ({"gradient": 1.0}, {"gradient": 3.0}, {"gradient": 3.0}, "right"),
    ({"gradient": 3.0}, {"gradient": 1.0}, {"gradient": 1.0}, "worse_than_stock"),
    (None, {"gradient": 1.0}, {"gradient": 1.0}, "silent_wrong"),
    (None, {"gradient": None}, {"gradient": None}, "silent_wrong"),
    (None, {"type": "ValueError", "error": "tfdtape: refused"},
     {"type": "ValueError", "error": "tfdtape: refused"}, "clear_error"),
    ({"type": "KeyError", "error": "x"}, {"type": "KeyError", "error": "x"},
     {"type": "KeyError", "error": "x"}, "stock_fails_alike"),
    (None, {"type": "KeyError", "error": "x"}, {"type": "KeyError", "error": "x"},
     "unclear_error"),
    (None, {"type": "KeyError", "error": "x", "noted": True},
     {"type": "KeyError", "error": "x", "noted": True}, "clear_error"),
    (None, {"gradient": 3.0}, {"gradient": 1.0}, "alone_differs"),
])
def test_outcomes_are_classified(stock, found, alone, outcome):
    assert gp.classify({"gradient": 3.0}, stock, found, alone) == outcome


def test_a_refusal_is_right_only_as_a_clear_error():
    refused = {"type": "ValueError", "error": "tfdtape: refused"}
    assert gp.classify(gp.REFUSE, None, refused, refused) == "clear_error"
    assert gp.classify(gp.REFUSE, None, {"gradient": 1.0},
                       {"gradient": 1.0}) == "silent_wrong"


def test_a_failure_shrinks_to_the_choices_that_matter():
    program = gp.Program(**dict(gp.SIMPLEST, persistent=True, extra_read=True,
                                target="local_sum", scope="none"))
    shrunk = gp.shrink(program, lambda p: p.extra_read and p.scope == "none")
    assert shrunk == gp.Program(**dict(gp.SIMPLEST, extra_read=True, scope="none"))


def test_errors_are_described_by_the_line_that_says_what_failed():
    note = ("tfdtape: this tape recorded the replicas of a strategy.run, and "
            "their backward pass runs here")
    assert gp.describe(ValueError(f"in user code:\n  File x\n  Boom 0x7f3a\n{note}")) == {
        "type": "ValueError", "error": "Boom 0x?", "noted": True}
    assert gp.describe(ValueError("in user code:\n\n    LookupError: op_12 failed")) == {
        "type": "ValueError", "error": "LookupError: op_? failed", "noted": False}
    assert gp.describe(RuntimeError("[tfdtape: no (x): y.] [Op:__inference_f_155]")) == {
        "type": "RuntimeError", "error": "tfdtape: no (x): y.] [Op:__inference_f_?]",
        "noted": False}
