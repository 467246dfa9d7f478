"""tfdtape.run_report: the JSON report's fields and the summary's lines."""

import os

import pytest
import tensorflow as tf

from tfdtape import run_report


def report(command=("s.py",), task=None, **snapshot):
    """A report of an empty recording, changed by `snapshot`'s fields."""
    return run_report.build(dict(run_report.EMPTY_SNAPSHOT, **snapshot),
                            list(command), 0, installed=True, task=task)


def test_the_report_needs_a_reason_exactly_when_incomplete():
    built = report()
    assert built["tensorflow"] == tf.__version__
    assert list(built)[7:9] == ["complete", "incomplete_reason"]
    assert built["complete"] is True and built["incomplete_reason"] is None
    incomplete = dict(run_report.EMPTY_SNAPSHOT, complete=False)
    with pytest.raises(ValueError, match="needs its reason"):
        run_report.build(incomplete, ["s.py"], 0, installed=True, task=None)
    with pytest.raises(ValueError, match="needs its reason"):
        run_report.build(run_report.EMPTY_SNAPSHOT, ["s.py"], 0, installed=True,
                         task=None, incomplete_reason="why")
    built = run_report.build(incomplete, ["s.py"], 0, installed=True,
                             task=None, incomplete_reason="why not")
    assert built["incomplete_reason"] == "why not"
    assert "\nwhy not\n" in run_report.summary(built)


def test_every_summary_line_is_one_line_within_100_columns():
    summary = run_report.summary(report(
        command=["train.py", "--note", "two\nlines\tand a tab"],
        task="worker-" + "x" * 120))
    lines = summary.splitlines()
    assert lines[0] == ("tfdtape run: train.py --note two\\nlines\\tand a tab "
                        "exited with status 0")
    assert lines[2].startswith("task: worker-xxx") and lines[2].endswith("...")
    assert max(map(len, lines)) == 100


def test_locations_are_shown_relative_to_the_given_directory(tmp_path):
    location = f"{tmp_path}/train.py:7"
    built = report(none_gradients=[{
        "source": "u:0", "reason": "not watched", "location": location,
        "context": "no strategy", "message": "m", "count": 1}])
    assert "      at train.py:7\n" in run_report.summary(built, relative_to=tmp_path)
    assert f"      at {location}\n" in run_report.summary(
        built, relative_to=os.path.dirname(tmp_path) + "/elsewhere")
