"""How `python -m tfdtape run` shows what its recorder counted: a summary
for people (within 100 columns) and a versioned JSON report.

The JSON schema (`SCHEMA`, documented in docs/run.md) is the recorder's
snapshot plus what describes the run: the command, its exit status, the
TensorFlow and tfdtape versions, whether tfdtape was installed, the
multi-worker task, and why the recording is incomplete when it is.
"""

import collections
import json
import os
import sys
import textwrap

SCHEMA = "tfdtape-run/1"
"""The JSON report's schema name and version; bumped on any incompatible
change."""

WIDTH = 100


EMPTY_SNAPSHOT = {"complete": True, "watched": [], "none_gradients": [],
                  "total_derivatives": []}
"""A recorder's snapshot when nothing was recorded."""


def build(snapshot, command, exit_status, installed, task,
          incomplete_reason=None):
    """The report (JSON-ready): what ran and how it ended, the versions, and
    the recorder's `snapshot`.

    Args:
        snapshot: `Recorder.snapshot()`.
        command: the command that ran, as a list of strings.
        exit_status: its exit status.
        installed: whether tfdtape was installed (else stock was observed).
        task: the multi-worker task, e.g. "worker-0", or None.
        incomplete_reason: why the recording is incomplete (required when
            the snapshot says it is), else None.
    """
    from tfdtape import versions  # pylint: disable=g-import-not-at-top
    if snapshot["complete"] != (incomplete_reason is None):
        raise ValueError("an incomplete recording needs its reason, and only it")
    tensorflow = sys.modules.get("tensorflow")
    return {"schema": SCHEMA, "command": list(command),
            "exit_status": exit_status,
            "tensorflow": getattr(tensorflow, "__version__", None),
            "tfdtape": versions.RELEASE, "installed": installed, "task": task,
            "complete": snapshot["complete"],
            "incomplete_reason": incomplete_reason, **snapshot}


def write_json(path, report):
    with open(path, "w", encoding="utf-8") as output:
        json.dump(report, output, indent=2)
        output.write("\n")


def summary(report, relative_to=None):
    """The summary for people: one block per question, within WIDTH columns.

    Paths inside `relative_to` (by default the working directory) are shown
    relative to it.
    """
    def relative(path):
        return _relative(path, relative_to)

    command = " ".join(_printable(argument) for argument in
                       [relative(report["command"][0]), *report["command"][1:]])
    ending = f" exited with status {report['exit_status']}"
    room = WIDTH - len("tfdtape run: ") - len(ending)
    if len(command) > room:
        command = "..." + command[len(command) - room + 3:]
    lines = [f"tfdtape run: {command}{ending}", _versions_line(report)]
    if report["task"]:
        lines.append(_shorten(f"task: {_printable(report['task'])}"))
    if not report["complete"]:
        lines += textwrap.wrap(report["incomplete_reason"], WIDTH)
    lines += ["", "What the tapes watched:"]
    lines += _watched_table(report["watched"]) or ["  nothing"]
    lines += ["", f"None gradients: {_none_count(report)}"]
    for item in report["none_gradients"]:
        lines.append(_shorten(
            f"  {item['source']}: {item['reason']} ({item['context']}), "
            f"{_times(item['count'])}"))
        lines.append(_shorten_left(f"      at {relative(item['location'])}"))
        lines += textwrap.wrap(item["message"], WIDTH, initial_indent="      ",
                               subsequent_indent="      ")
    lines += ["", "Cross-replica total derivatives (sum over components): "
              + str(sum(item["count"] for item in report["total_derivatives"]))]
    for item in report["total_derivatives"]:
        lines.append(_shorten(
            f"  {item['source']}: sum of {item['components']} components, "
            f"{_times(item['count'])}"))
        lines.append(_shorten_left(f"      at {relative(item['location'])}"))
    return "\n".join(lines)


def _versions_line(report):
    if report["tensorflow"] is None:
        return (f"tfdtape {report['tfdtape']}: the script did not import "
                "TensorFlow, so there was nothing to record")
    return (f"TensorFlow {report['tensorflow']}, tfdtape {report['tfdtape']} "
            + ("installed" if report["installed"] else
               "not installed (stock TensorFlow observed)"))


def _watched_table(watched):
    """One row per (variable, how): where it was watched, reads and watches."""
    rows = collections.OrderedDict()
    for item in watched:
        row = rows.setdefault((item["variable"], item["how"]), {
            "contexts": collections.OrderedDict(), "access": 0, "watch": 0})
        replicas = row["contexts"].setdefault(item["context"], [])
        if item["replica"] is not None and item["replica"] not in replicas:
            replicas.append(item["replica"])
        row[item["kind"]] += item["count"]
    if not rows:
        return []
    table = [("variable", "how", "where (replicas)", "reads", "watches")]
    for (variable, how), row in rows.items():
        where = ", ".join(
            context + (f" {_replica_list(replicas)}" if replicas else "")
            for context, replicas in row["contexts"].items())
        table.append((variable, how, where, str(row["access"]),
                      str(row["watch"])))
    widths = [min(max(len(r[i]) for r in table), limit)
              for i, limit in enumerate((36, 10, 30, 8, 8))]
    return ["  " + "  ".join(
        _shorten(cell, width).rjust(width) if index >= 3 else
        _shorten(cell, width).ljust(width)
        for index, (cell, width) in enumerate(zip(row, widths))).rstrip()
        for row in table]


def _replica_list(replicas):
    """E.g. '0', '0,1' or '0-3'."""
    replicas = sorted(replicas)
    if len(replicas) > 2 and replicas == list(range(replicas[0], replicas[-1] + 1)):
        return f"{replicas[0]}-{replicas[-1]}"
    return ",".join(map(str, replicas))


def _relative(path, start):
    """An absolute `path` (or 'path:line') relative to `start` (by default
    the working directory) when it lies inside it, so that it fits the line;
    anything else as it is."""
    if not os.path.isabs(path):
        return path
    try:
        relative = os.path.relpath(path, start)
    except (OSError, ValueError):  # the working directory is gone
        return path
    return path if relative.startswith(os.pardir) else relative


def _printable(text):
    """`text` on one line: control characters (a newline in an argument,
    say) as escapes."""
    return text if text.isprintable() else text.encode(
        "unicode_escape").decode("ascii")


def _none_count(report):
    return str(sum(item["count"] for item in report["none_gradients"]))


def _times(count):
    return "once" if count == 1 else f"{count} times"


def _shorten_left(text, width=WIDTH):
    """A location line cut at its left (the file name and line stay)."""
    indent = len(text) - len(text.lstrip())
    if len(text) <= width:
        return text
    return " " * indent + "..." + text[len(text) - (width - indent - 3):]


def _shorten(text, width=WIDTH):
    return text if len(text) <= width else text[:width - 3] + "..."
