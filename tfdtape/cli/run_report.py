"""How `python -m tfdtape run` shows what its recorder counted: a summary
for people (within 100 columns) and a versioned JSON report.

The summary is short when nothing is wrong: what the tapes watched is
counted by context and by how it was watched (`--verbose` adds one row per
variable), gradients are counted, and only what went wrong is listed — None
gradients grouped by (variable, reason, line) with each reason explained
once, and warnings. The JSON report (`SCHEMA`, documented in docs/run.md)
always has every row: the recorder's snapshot plus what describes the run
(the command, the script's and the run's exit status, the TensorFlow and
tfdtape versions, whether tfdtape was installed, the multi-worker task, and
why the recording is incomplete when it is).
"""

import collections
import json
import os
import sys
import textwrap

SCHEMA = "tfdtape-run/2"
"""The JSON report's schema name and version; bumped on any incompatible
change."""

WIDTH = 100
LISTED = 10
"""At most this many groups of a kind are listed without --verbose."""

EMPTY_SNAPSHOT = {"complete": True, "variables": [], "watched": [],
                  "gradient_calls": 0, "gradient_calls_around_runs": 0,
                  "none_gradients": [],
                  "total_derivatives": [], "warnings": []}
"""A recorder's snapshot when nothing was recorded."""

READ_COUNT_NOTE = ("reads: once per eager read, once per trace inside a "
                   "tf.function; a row per variable: --verbose")

WARNING_ADVICE = {
    "plain variable in replica context": (
        "a plain variable (created outside strategy.scope()) read or "
        "differentiated inside strategy.run under a strategy of several "
        "replicas: every replica reads and updates that one variable. Create "
        "it inside strategy.scope(), so that each replica has its own copy"),
    "cross-replica gradient on one device": (
        "a cross-replica gradient that only one component of the variables "
        "took part in: the step ran on one device, not on every replica. "
        "Compute the loss inside strategy.run to train on every replica"),
    "MEAN of compute_average_loss": (
        "strategy.reduce(MEAN) under a tape around strategy.run of losses "
        "from tf.nn.compute_average_loss, which divides by the global batch "
        "already: the MEAN is 1/N of the loss over the global batch, and so "
        "is its gradient where the tape differentiates it. Reduce them with "
        "SUM (or take per-replica means, tf.reduce_mean, before a MEAN)"),
    "clipping inside the replicas": (
        "clipped inside strategy.run under several replicas, each replica's "
        "share of the gradient is clipped before the all-reduce: once a share "
        "is clipped, the step differs from one device. Take the tape around "
        "strategy.run and apply after it (the total is clipped), or all-reduce "
        "first and clip the totals"),
    "Keras distribution on one device": (
        "keras.distribution.set_distribution on the TensorFlow backend without "
        "tfdtape: Keras accepts the distribution and ignores it, and the model "
        "trains on one device with plain variables. Run with tfdtape installed "
        "(it trains a DataParallel through tf.distribute), or train under a "
        "tf.distribute strategy"),
    "mirrored copies differ": (
        "at the end of the run, a mirrored variable's copies (one per replica, "
        "written alike) hold different values, so the replicas train different "
        "models from there on. Look for an update made inside strategy.run that "
        "is not all-reduced (an assign of a per-replica value)"),
    "refused by tfdtape": (
        "errors tfdtape raised (a refusal rather than a silent wrong answer, "
        "or input it cannot take), whether the script caught them or not"),
}
"""What each warning kind means and what to do, printed once per kind."""


def build(snapshot, command, exit_status, installed, task,
          incomplete_reason=None, run_exit_status=None, run_exit_reason=None):
    """The report (JSON-ready): what ran and how it ended, the versions, and
    the recorder's `snapshot`.

    Args:
        snapshot: `EventCounts.snapshot()`.
        command: the command that ran, as a list of strings.
        exit_status: the script's exit status.
        installed: whether tfdtape was installed (else stock was observed).
        task: the multi-worker task, e.g. "worker-0", or None.
        incomplete_reason: why the recording is incomplete (required when
            the snapshot says it is), else None.
        run_exit_status: the status the run itself exits with, when it is
            not the script's; then `run_exit_reason` says why.
    """
    from tfdtape import versions
    if snapshot["complete"] != (incomplete_reason is None):
        raise ValueError("an incomplete recording needs its reason, and only it")
    if (run_exit_status is None) != (run_exit_reason is None):
        raise ValueError("a run exit status of its own needs its reason, and only it")
    version = getattr(sys.modules.get("tensorflow"), "__version__", None)
    return {"schema": SCHEMA, "command": list(command),
            "exit_status": exit_status,
            "run_exit_status": (exit_status if run_exit_status is None
                                else run_exit_status),
            "run_exit_reason": run_exit_reason,
            "tensorflow": version,
            "tensorflow_untested": (None if version is None else
                                    versions.untested_reason(version)),
            "tfdtape": versions.RELEASE, "installed": installed, "task": task,
            "complete": snapshot["complete"],
            "incomplete_reason": incomplete_reason, **snapshot}


def write_json(path, report):
    with open(path, "w", encoding="utf-8") as output:
        json.dump(report, output, indent=2)
        output.write("\n")


def summary(report, relative_to=None, verbose=False):
    """The summary for people: one block per question, within WIDTH columns.

    Locations are shown relative to `relative_to` (by default the working
    directory). `verbose` adds a row per variable and lists every group.
    """
    def relative(location):
        return _relative(location, relative_to)

    lines = _header(report, relative)
    lines += ["", "What the tapes watched:"]
    counts = _watched_counts(report["watched"])
    lines += counts + [f"  ({READ_COUNT_NOTE})"] if counts else ["  nothing"]
    if verbose and report["watched"]:
        lines += ["", "One row per variable:"] + _variable_rows(report)
    lines += ["", _gradients_line(report)]
    lines += _none_gradients(report["none_gradients"], relative, verbose)
    lines += _totals(report["total_derivatives"], relative, verbose)
    lines += _warnings(report["warnings"], relative, verbose)
    return "\n".join(lines)


def _header(report, relative):
    command = " ".join(_printable(argument) for argument in
                       [relative(report["command"][0]), *report["command"][1:]])
    ending = f" exited with status {report['exit_status']}"
    room = WIDTH - len("tfdtape run: ") - len(ending)
    if len(command) > room:
        command = "..." + command[len(command) - room + 3:]
    lines = [f"tfdtape run: {command}{ending}"]
    if report.get("run_exit_reason"):
        lines += textwrap.wrap(
            f"tfdtape run exits with status {report['run_exit_status']}: "
            f"{report['run_exit_reason']}", WIDTH)
    lines.append(_versions_line(report))
    if report["task"]:
        lines.append(_shorten(f"task: {_printable(report['task'])}"))
    if not report["complete"]:
        lines += textwrap.wrap(report["incomplete_reason"], WIDTH)
    return lines


def _versions_line(report):
    if report["tensorflow"] is None:
        return (f"tfdtape {report['tfdtape']}: the script did not import "
                "TensorFlow, so there was nothing to record")
    untested = " (untested)" if report.get("tensorflow_untested") else ""
    return (f"TensorFlow {report['tensorflow']}{untested}, tfdtape "
            f"{report['tfdtape']} "
            + ("installed" if report["installed"] else
               "not installed (stock TensorFlow observed)"))


def _watched_counts(watched):
    """One row per (context, how): variables, reads and watches."""
    groups = collections.OrderedDict()
    for item in watched:
        group = groups.setdefault((item["context"], item["how"]), {
            "variables": set(), "replicas": set(), "access": 0, "watch": 0})
        group["variables"].add(item["id"])
        if item["replica"] is not None:
            group["replicas"].add(item["replica"])
        group[item["kind"]] += item["count"]
    if not groups:
        return []
    table = [("context", "watched as", "variables", "reads", "watches")]
    for (context, how), group in sorted(groups.items(), key=_context_order):
        if group["replicas"]:
            context += f" {_replica_list(group['replicas'])}"
        table.append((context, how, str(len(group["variables"])),
                      str(group["access"]), str(group["watch"])))
    return _table(table, right_aligned_from=2)


_CONTEXTS = ("no strategy", "replica", "cross-replica")
_HOWS = ("plain", "container", "components", "component")


def _context_order(item):
    (context, how), _ = item
    return (_CONTEXTS.index(context) if context in _CONTEXTS else len(_CONTEXTS),
            _HOWS.index(how) if how in _HOWS else len(_HOWS))


def _variable_rows(report):
    """--verbose: one row per variable, named as everywhere in the report."""
    types = {variable["id"]: variable["type"] for variable in report["variables"]}
    rows = collections.OrderedDict()
    for item in report["watched"]:
        row = rows.setdefault(item["id"], {
            "name": item["variable"], "how": [], "where": collections.OrderedDict(),
            "access": 0, "watch": 0})
        if item["how"] not in row["how"]:
            row["how"].append(item["how"])
        replicas = row["where"].setdefault(item["context"], set())
        if item["replica"] is not None:
            replicas.add(item["replica"])
        row[item["kind"]] += item["count"]
    table = [("id", "variable", "type", "watched as", "where", "reads", "watches")]
    for identity, row in rows.items():
        where = ", ".join(context + (f" {_replica_list(replicas)}" if replicas else "")
                          for context, replicas in row["where"].items())
        table.append((str(identity), _elide(row["name"], 40),
                      types.get(identity, "?"), ",".join(row["how"]), where,
                      str(row["access"]), str(row["watch"])))
    return _table(table, right_aligned_from=5)


def _table(rows, right_aligned_from):
    """Rows of cells as aligned lines, indented by two."""
    widths = [max(len(row[index]) for row in rows) for index in range(len(rows[0]))]
    return ["  " + "  ".join(
        cell.rjust(width) if index >= right_aligned_from else cell.ljust(width)
        for index, (cell, width) in enumerate(zip(row, widths))).rstrip()
        for row in rows]


def _gradients_line(report):
    line = (f"Gradients: {report['gradient_calls']} tape.gradient calls; None: "
            f"{_total_count(report['none_gradients'])}; total derivatives: "
            f"{_total_count(report['total_derivatives'])}")
    around_runs = report.get("gradient_calls_around_runs", 0)
    if around_runs:
        line += f"; from tapes around strategy.run: {around_runs}"
    return line


def _none_gradients(none_gradients, relative, verbose):
    """None gradients grouped by (variable, reason, line), each reason's
    explanation once."""
    if not none_gradients:
        return []
    groups = collections.OrderedDict()
    for item in none_gradients:
        key = (item["source"], item["reason"], item["location"])
        group = groups.setdefault(key, {"count": 0, "contexts": []})
        group["count"] += item["count"]
        if item["context"] not in group["contexts"]:
            group["contexts"].append(item["context"])
    count = _total_count(none_gradients)
    lines = ["", f"None gradient{'' if count == 1 else 's'}: {count}"]
    listed = list(groups.items()) if verbose else list(groups.items())[:LISTED]
    for (source, reason, location), group in listed:
        lines += _wrapped(
            f"{source}: {reason} ({', '.join(group['contexts'])}), "
            f"{_times(group['count'])} at {relative(location)}")
    lines += _more(len(groups) - len(listed))
    explained = collections.OrderedDict(
        (item["reason"], item["message"]) for item in none_gradients)
    for reason, message in explained.items():
        lines += _wrapped(f"{reason}: {message}", indent="  why ")
    return lines


_TOTALS_HEADING = "Total derivatives (summed over the replicas' components):"


def _totals(totals, relative, verbose):
    """Total derivatives by call site (by variable with `verbose`)."""
    if not totals:
        return []
    lines = []
    if verbose:
        for item in totals:
            lines += _wrapped(
                f"{item['source']}: sum of {item['components']} components"
                f"{_across(item.get('workers', 1))}, "
                f"{_times(item['count'])} at {relative(item['location'])}")
        return ["", _TOTALS_HEADING] + lines
    sites = collections.OrderedDict()
    for item in totals:
        site = sites.setdefault(item["location"], {"variables": set(), "count": 0,
                                                   "components": set(), "workers": 1})
        site["variables"].add(item["id"])
        site["components"].add(item["components"])
        site["workers"] = max(site["workers"], item.get("workers", 1))
        site["count"] += item["count"]
    for location, site in list(sites.items())[:LISTED]:
        components = "/".join(map(str, sorted(site["components"])))
        lines += _wrapped(
            f"at {relative(location)}: {_plural(len(site['variables']), 'variable')}"
            f", each the sum of {components} components{_across(site['workers'])}, "
            f"{site['count']} in all")
    lines += _more(len(sites) - min(len(sites), LISTED))
    return ["", _TOTALS_HEADING] + lines


def _across(workers):
    """", all-reduced across N workers" where the totals were (N > 1)."""
    return f", all-reduced across {workers} workers" if workers > 1 else ""


def _warnings(warnings, relative, verbose):
    if not warnings:
        return []
    lines = ["", f"Warnings: {len(warnings)}"]
    by_kind = collections.OrderedDict()
    for item in warnings:
        by_kind.setdefault(item["kind"], []).append(item)
    for kind, items in by_kind.items():
        lines += _wrapped(f"{kind}: {WARNING_ADVICE[kind]}")
        listed = items if verbose else items[:LISTED]
        for item in listed:
            if kind == "plain variable in replica context":
                text = (f"{item['variable']}: used {_times(item['count'])}, "
                        f"first at {relative(item['location'])}")
            elif kind == "mirrored copies differ":
                text = f"{item['variable']}: {item['subject']}"
            elif item.get("subject"):  # a replica thread of model.fit: no location
                text = item["subject"] + ("" if item["location"] == "?" else
                                          f": first at {relative(item['location'])}")
            elif kind == "refused by tfdtape":
                text = (f"{_times(item['count'])} at {relative(item['location'])}: "
                        f"{item['message']}")
            else:
                text = f"{_times(item['count'])} at {relative(item['location'])}"
            lines += _wrapped(text, indent="    ")
        lines += _more(len(items) - len(listed), indent="    ")
    return lines


def _more(hidden, indent="  "):
    return [f"{indent}... and {hidden} more (--verbose, or --json)"] if hidden > 0 else []


def _wrapped(text, indent="  "):
    """`text` wrapped within WIDTH, continuation lines indented further."""
    return textwrap.wrap(_printable(text), WIDTH, initial_indent=indent,
                         subsequent_indent=" " * (len(indent) + 4),
                         break_on_hyphens=False, break_long_words=False)


def _replica_list(replicas):
    """E.g. '0', '0,1' or '0-3'."""
    replicas = sorted(replicas)
    if len(replicas) > 2 and replicas == list(range(replicas[0], replicas[-1] + 1)):
        return f"{replicas[0]}-{replicas[-1]}"
    return ",".join(map(str, replicas))


def _relative(location, start):
    """A 'path' or 'path:line' relative to `start` (by default the working
    directory), normalised, however the script was named; a path that is not
    absolute, or one more than three folders up, as it is."""
    path, colon, line = location.rpartition(":")
    if not colon or not line.isdigit():
        path, colon, line = location, "", ""
    if not os.path.isabs(path):
        return location
    try:
        relative = os.path.relpath(path, start)
    except (OSError, ValueError):  # the working directory is gone
        return os.path.normpath(path) + colon + line
    if relative.split(os.sep)[:4] == [os.pardir] * 4:
        relative = os.path.normpath(path)
    return relative + colon + line


def _printable(text):
    """`text` on one line: control characters (a newline in an argument,
    say) as escapes."""
    return text if text.isprintable() else text.encode(
        "unicode_escape").decode("ascii")


def _total_count(items):
    return sum(item["count"] for item in items)


def _plural(count, noun):
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _times(count):
    return "once" if count == 1 else f"{count} times"


def _elide(text, width):
    """`text` within `width`, its middle replaced by '...' (both ends kept)."""
    if len(text) <= width:
        return text
    head = (width - 3 + 1) // 2
    return text[:head] + "..." + text[len(text) - (width - 3 - head):]


def _shorten(text, width=WIDTH):
    return text if len(text) <= width else text[:width - 3] + "..."
