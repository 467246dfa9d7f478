"""tfdtape.cli.run_report: the JSON report's fields and the summary's lines."""

import os

import pytest
import tensorflow as tf

from tfdtape import versions
from tfdtape.cli import run_report


def report(command=("s.py",), task=None, **snapshot):
    """A report of an empty recording, changed by `snapshot`'s fields."""
    return run_report.build(dict(run_report.EMPTY_SNAPSHOT, **snapshot),
                            list(command), 0, installed=True, task=task)


def test_the_report_needs_a_reason_exactly_when_incomplete():
    built = report()
    assert built["tensorflow"] == tf.__version__
    assert built["schema"] == "tfdtape-run/2"
    assert list(built)[10:12] == ["complete", "incomplete_reason"]
    assert built["tensorflow_untested"] == versions.untested_reason(tf.__version__)
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


def test_the_status_line_states_the_runs_own_status_and_why():
    built = run_report.build(
        run_report.EMPTY_SNAPSHOT, ["s.py"], 0, installed=True, task=None,
        run_exit_status=1, run_exit_reason="--fail-on-none-gradient, and 3 None "
        "gradients")
    assert (built["exit_status"], built["run_exit_status"]) == (0, 1)
    assert run_report.summary(built).splitlines()[:2] == [
        "tfdtape run: s.py exited with status 0",
        "tfdtape run exits with status 1: --fail-on-none-gradient, and 3 None "
        "gradients"]
    plain = report()
    assert (plain["run_exit_status"], plain["run_exit_reason"]) == (0, None)
    with pytest.raises(ValueError, match="needs its reason"):
        run_report.build(run_report.EMPTY_SNAPSHOT, ["s.py"], 0, installed=True,
                         task=None, run_exit_status=1)


@pytest.mark.parametrize("location, shown", [
    ("{here}/train.py:7", "train.py:7"),
    ("{here}/sub/../train.py:7", "train.py:7"),
    ("{parent}/other/train.py:7", "../other/train.py:7"),
    ("/far/away/train.py:7", "/far/away/train.py:7"),
    ("?", "?"),
], ids=["inside", "with ..", "next door", "four folders up", "unknown"])
def test_locations_are_relative_to_the_starting_directory(tmp_path, location,
                                                          shown):
    here = tmp_path / "a" / "b" / "c" / "d"
    here.mkdir(parents=True)
    location = location.format(here=here, parent=here.parent)
    built = report(none_gradients=[{
        "source": "u:0", "id": 1, "reason": "not watched", "location": location,
        "context": "no strategy", "message": "m", "count": 1}])
    assert f"u:0: not watched (no strategy), once at {shown}\n" in (
        run_report.summary(built, relative_to=here))


def many_variables(count):
    """A healthy 4-replica recording of `count` variables, each read by every
    replica in 68 steps, with one cross-replica site."""
    variables = [{"id": index, "name": f"model/block_{index}/kernel",
                  "type": "MirroredVariable", "strategy": "MirroredStrategy"}
                 for index in range(1, count + 1)]
    watched = [{"variable": v["name"], "id": v["id"], "how": "container",
                "kind": "access", "context": "replica", "replica": replica,
                "strategy": "MirroredStrategy", "count": 68}
               for v in variables for replica in range(4)]
    return dict(variables=variables, watched=watched, gradient_calls=272)


def test_a_healthy_run_of_any_size_fits_a_screen():
    built = report(**many_variables(160))
    lines = run_report.summary(built).splitlines()
    assert len(lines) <= 25, "\n".join(lines)
    assert lines[4:8] == [
        "  context      watched as  variables  reads  watches",
        "  replica 0-3  container         160  43520        0",
        "  (reads: once per eager read, once per trace inside a tf.function; a "
        "row per variable: --verbose)",
        ""]
    assert ("Gradients: 272 tape.gradient calls; None: 0; total derivatives: 0"
            in lines)
    verbose = run_report.summary(built, verbose=True).splitlines()
    rows = [line for line in verbose if "model/block_" in line]
    assert len(rows) == 160
    assert rows[0].split() == ["1", "model/block_1/kernel", "MirroredVariable",
                               "container", "replica", "0-3", "272", "0"]
    assert max(map(len, verbose)) <= 100


def test_none_gradients_are_grouped_and_each_reason_explained_once():
    none_gradients = [
        {"source": f"layer_{index}/bias", "id": index, "reason": "not connected "
         "to the target", "location": "/w/train.py:19", "context": context,
         "message": "it was watched, but the target does not depend on it",
         "count": 2}
        for index in range(1, 13) for context in ("replica", "cross-replica")]
    built = report(none_gradients=none_gradients, gradient_calls=4)
    lines = run_report.summary(built, relative_to="/w").splitlines()
    assert "None gradients: 48" in lines
    groups = [line for line in lines if "/bias: not connected" in line]
    assert groups[0] == ("  layer_1/bias: not connected to the target (replica, "
                         "cross-replica), 4 times at train.py:19")
    assert len(groups) == run_report.LISTED
    assert "  ... and 2 more (--verbose, or --json)" in lines
    assert sum("it was watched, but" in line for line in lines) == 1
    verbose = run_report.summary(built, relative_to="/w", verbose=True)
    assert verbose.count("/bias: not connected") == 12


def test_long_names_are_wrapped_not_cut():
    name = "decoder/bahdanau_attention/" + "dense_projection_" * 3 + "kernel"
    built = report(none_gradients=[{
        "source": name, "id": 1, "reason": "not watched",
        "location": "/w/t.py:3", "context": "replica", "message": "m",
        "count": 1}])
    summary = run_report.summary(built, relative_to="/w")
    assert name in " ".join(line.strip() for line in summary.splitlines())
    assert max(map(len, summary.splitlines())) <= 100


def test_warnings_say_what_they_mean_once_per_kind():
    warnings = [
        {"kind": "plain variable in replica context", "variable": "w:0",
         "id": 1, "location": "/w/t.py:9", "count": 6},
        {"kind": "cross-replica gradient on one device", "variable": None,
         "id": None, "location": "/w/t.py:20", "count": 3},
        {"kind": "refused by tfdtape", "variable": None, "id": None,
         "message": "tfdtape: cannot watch this object (tf.GradientTape.watch)",
         "location": "/w/t.py:30", "count": 1},
    ]
    lines = run_report.summary(report(warnings=warnings),
                               relative_to="/w").splitlines()
    start = lines.index("Warnings: 3")
    text = "\n".join(lines[start:])
    assert "    w:0: used 6 times, first at t.py:9" in text
    assert "    3 times at t.py:20" in text
    assert ("    once at t.py:30: tfdtape: cannot watch this object "
            "(tf.GradientTape.watch)") in text
    assert text.count("Create it inside") == 1
    assert max(map(len, lines)) <= 100


def test_relative_keeps_the_working_directory_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    built = report(none_gradients=[{
        "source": "u:0", "id": 1, "reason": "not watched",
        "location": f"{tmp_path}/x.py:2", "context": "replica", "message": "m",
        "count": 1}])
    assert "once at x.py:2" in run_report.summary(built)
    assert os.getcwd() == str(tmp_path)


def test_an_untested_tensorflow_is_marked(monkeypatch):
    monkeypatch.setattr(tf, "__version__", "2.23.0-dev20261026")
    built = report()
    assert built["tensorflow_untested"] == (
        "a development build, newer than the tested range")
    assert run_report.summary(built).splitlines()[1] == (
        "TensorFlow 2.23.0-dev20261026 (untested), tfdtape 0.1.0 installed")


def test_one_none_gradient_is_singular():
    built = report(none_gradients=[{
        "source": "u:0", "id": 1, "reason": "not watched", "location": "?",
        "context": "replica", "message": "m", "count": 1}])
    assert "None gradient: 1" in run_report.summary(built).splitlines()
