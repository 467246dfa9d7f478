"""Runs tfdtape's tests and `verify` on tensorflow-cpu releases and on the
pinned nightly builds.

For each build (by default the newest patch of every minor release in
tfdtape's tested range that pip can install here; `--nightly` adds the pinned
tf-nightly, keras-nightly and tf-keras-nightly builds of NIGHTLY), it creates
an isolated virtual environment, installs that TensorFlow and tfdtape, runs
the test suite and `python -m tfdtape verify --json`, and updates the table
of results in docs/compatibility.md: the rows of the builds checked are
replaced, each naming the commit it was checked on, and the others are kept.

`--per-release` (CI's version stages) runs, instead of the whole suite, the
tests whose outcome can depend on the release (`pytest --per-release`,
tests/release_selection.py), recording what they ran, and then the proof
that they ran every patch target and compat accessor of that build
(tests/test_release_rule.py); its rows say "per-release tests".

The nightly build is untested by definition, so its tests run with
TFDTAPE_ALLOW_UNTESTED_TENSORFLOW=1. If the registry no longer serves one of
its pinned builds, it is skipped with one line saying so, not failed.

Usage:
  python tools/matrix.py [--versions 2.12.1 2.21.0] [--nightly] [--per-release]
                         [--workdir DIR] [--output docs/compatibility.md]
"""

import argparse
import dataclasses
import json
import pathlib
import re
import runpy
import shutil
import subprocess
import sys
import time
import types
import venv

ROOT = pathlib.Path(__file__).resolve().parent.parent
# tfdtape/versions.py alone: importing the package would import TensorFlow.
versions = types.SimpleNamespace(**runpy.run_path(str(ROOT / "tfdtape" / "versions.py")))

PYTEST_SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed|error).*?) in [\d.]+s",
                            re.MULTILINE)


NIGHTLY_NAME = "tf-nightly 2.23.0.dev20261026"
NIGHTLY = (["tf-nightly==2.23.0.dev20261026",
            "keras-nightly==3.16.0.dev2026102704"],
           ["tf-keras-nightly==2.23.0.dev2026102618"])
"""The pinned nightly builds: (installed with their dependencies, installed
without), so that a run is reproducible."""

FAILED_TEST = re.compile(r"^(?:FAILED|ERROR) tests/.*$", re.MULTILINE)
"""pytest's short test summary line of a test that failed or erred."""

SLOWEST = re.compile(r"^\d+\.\d+s (?:call|setup|teardown) +tests/.*$", re.MULTILINE)
"""A line of pytest's --durations table."""

WHOLE_SUITE = (["-n", "auto", "-m", "not cluster"], ["-m", "cluster"])
"""README's test command, as two pytest runs' selections."""

NOT_SERVED = re.compile(r"No matching distribution found for (\S+)")


@dataclasses.dataclass(frozen=True)
class Build:
    """One TensorFlow to check: its table row name, what pip installs (with
    dependencies, then without), and whether it is an untested build."""
    name: str
    requirements: tuple
    requirements_without_dependencies: tuple = ()
    untested: bool = False


def release_build(version):
    """tensorflow-cpu==version, with Keras 2 (tf_keras) from 2.16 on: it
    requires the `tensorflow` distribution, so it goes in without deps."""
    major, minor = versions.parse_release(version)
    keras_2 = ((f"tf_keras~={major}.{minor}.0",) if (major, minor) >= (2, 16)
               else ())
    return Build(version, (f"tensorflow-cpu=={version}",), keras_2)


def nightly_build():
    with_dependencies, without = NIGHTLY
    return Build(NIGHTLY_NAME, tuple(with_dependencies), tuple(without),
                 untested=True)


@dataclasses.dataclass
class Outcome:
    """What one TensorFlow build gave."""
    version: str
    installed: str = "not tried"
    tests: str = "not run"
    verify: str = "not run"
    notes: list = dataclasses.field(default_factory=list)
    minutes: float = 0.0
    failed_tests: list = dataclasses.field(default_factory=list)
    """pytest's short summary lines of the tests that failed or erred."""
    slowest: list = dataclasses.field(default_factory=list)
    """pytest's --durations lines of the slowest tests, slowest first."""


def available_releases():
    """Newest patch of each minor release pip offers in the tested range."""
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "tensorflow-cpu"],
        capture_output=True, text=True, check=True).stdout
    found = re.search(r"Available versions: (.*)", listing).group(1).split(", ")
    newest = {}
    for version in found:
        if not re.fullmatch(r"\d+\.\d+\.\d+", version):
            continue  # pre-releases and post-releases
        if not versions.is_tested(version):
            continue
        release = versions.parse_release(version)
        key = tuple(int(part) for part in version.split("."))
        if release not in newest or key > newest[release][0]:
            newest[release] = (key, version)
    return [version for _, (_, version) in sorted(newest.items())]


def run(command, log, **kwargs):
    """Runs `command`, appending its output to `log`; returns the process."""
    with open(log, "a", encoding="utf-8") as output:
        output.write(f"\n$ {' '.join(map(str, command))}\n")
        output.flush()
        return subprocess.run(command, stdout=output, stderr=subprocess.STDOUT,
                              text=True, **kwargs)


def snapshot(workdir):
    """Copies the committed tree (git HEAD) to workdir/src; returns its path.

    Every release is checked against the same code, however long the run
    takes and whatever changes in the working tree meanwhile.
    """
    source = workdir / "src"
    if source.exists():
        shutil.rmtree(source)
    source.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
    return source


def test_runs(per_release, exercised):
    """The pytest runs' arguments: README's test command, or the version
    stages' tests recording into `exercised` and then the proof on what
    they recorded."""
    if not per_release:
        return [list(selection) for selection in WHOLE_SUITE]
    recording = ["--per-release", "--record-exercise", str(exercised)]
    return [[*WHOLE_SUITE[0], *recording], [*WHOLE_SUITE[1], *recording],
            ["--exercised-data", str(exercised)]]


def check_build(build, workdir, source, per_release=False):
    """Installs `build` in a fresh venv and runs everything from the
    `source` tree (the version stages' tests, `per_release`)."""
    outcome = Outcome(build.name)
    started = time.monotonic()
    slug = re.sub(r"[^\w.]+", "-", build.name)
    if not slug.startswith("tf-"):
        slug = f"tf-{slug}"  # tf-2.12.1, tf-nightly-...
    env_dir = workdir / slug
    log = workdir / f"{slug}.log"
    log.write_text("")
    venv.create(env_dir, with_pip=True, clear=True)
    python = env_dir / "bin" / "python"
    steps = [[*build.requirements], ["-e", f"{source}[test]"]]
    if build.requirements_without_dependencies:
        steps.append(["--no-deps", *build.requirements_without_dependencies])
    for step in steps:
        install = run([python, "-m", "pip", "install", "-q", *step], log)
        if install.returncode != 0:
            break
    outcome.installed = "yes" if install.returncode == 0 else "failed"
    if install.returncode != 0:
        missing = NOT_SERVED.findall(log.read_text())
        if missing:
            outcome.installed = "not served"
            outcome.notes.append(f"the registry no longer serves {missing[0]}")
        else:
            outcome.notes.append(f"pip failed, see {log.name}")
        return outcome
    env = {"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": f"{env_dir / 'bin'}:/usr/bin:/bin"}
    if build.untested:
        env["TFDTAPE_ALLOW_UNTESTED_TENSORFLOW"] = "1"
    # As README's test command: in parallel, then the cluster tests alone.
    summaries = []
    exercised = workdir / f"{slug}-exercised"
    shutil.rmtree(exercised, ignore_errors=True)
    for selection in test_runs(per_release, exercised):
        tests = run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                     "--durations=10", *selection, str(source / "tests")], log,
                    cwd=source, env=env)
        summary = PYTEST_SUMMARY.findall(log.read_text())
        summaries.append(summary[-1] if summary else f"exit {tests.returncode}")
    outcome.tests = combined_summary(summaries)
    if per_release:
        outcome.tests = f"per-release tests: {outcome.tests}"
    outcome.failed_tests = FAILED_TEST.findall(log.read_text())
    outcome.slowest = sorted(SLOWEST.findall(log.read_text()),
                             key=lambda line: -float(line.split("s ", 1)[0]))[:10]
    report_path = workdir / f"{slug}-verify.json"
    verify = run([python, "-m", "tfdtape", "verify", "--json", str(report_path)],
                 log, cwd=source, env=env)
    if report_path.exists() and verify.returncode in (0, 1):
        report = json.loads(report_path.read_text())
        passed = sum(check["status"] == "PASS" for check in report["checks"])
        outcome.verify = f"{passed}/{len(report['checks'])} passed"
        outcome.notes += [f"{check['name']}: {check['message']}"
                          for check in report["checks"]
                          if check["status"] != "PASS"]
    else:
        outcome.verify = f"exit {verify.returncode}"
        report_path.unlink(missing_ok=True)
    outcome.minutes = (time.monotonic() - started) / 60
    return outcome


OUTCOME_WORDS = ("passed", "failed", "skipped", "xfailed", "xpassed", "error",
                 "errors")
"""pytest's counts of test outcomes (not of warnings or deselected tests)."""


def combined_summary(summaries):
    """pytest's outcome counts of several runs as one ('975 passed, 4
    skipped'), or the summaries joined when one did not finish."""
    counts = {}
    for summary in summaries:
        parts = [(int(number), word) for number, word
                 in re.findall(r"(\d+) (\w+)", summary) if word in OUTCOME_WORDS]
        if not parts or summary.startswith("exit"):
            return "; ".join(summaries)
        for number, word in parts:
            counts[word] = counts.get(word, 0) + number
    return ", ".join(f"{number} {word}" for word, number in counts.items())


TABLE_HEADER = "| TensorFlow | commit | install | tests | verify | notes |"


def write_table(outcomes, output, commit):
    """Writes the table to `output`: the rows of `outcomes` (checked on
    `commit`) replace those of the same builds, other rows are kept."""
    rows = {}
    if output.exists():
        for line in output.read_text(encoding="utf-8").splitlines():
            cells = line.split(" | ")
            if line.startswith("| ") and len(cells) == 6 and "---" not in line \
                    and line != TABLE_HEADER:
                rows[cells[0].removeprefix("| ")] = line
    for outcome in outcomes:
        notes = "; ".join(outcome.notes).replace("|", "\\|") or "-"
        rows[outcome.version] = (
            f"| {outcome.version} | {commit} | {outcome.installed} | "
            f"{outcome.tests} | {outcome.verify} | {notes} |")
    lines = [
        "# Compatibility",
        "",
        "Generated by `python tools/matrix.py` (do not edit by hand): for each",
        "TensorFlow build, a fresh virtual environment on Python "
        f"{sys.version.split()[0]}, the",
        "test suite (README's test command) and `python -m tfdtape verify`, on the",
        "committed tree named in the row. Releases are tensorflow-cpu with",
        "tf_keras from 2.16; the nightly row is the pinned tf-nightly,",
        "keras-nightly and tf-keras-nightly builds of `tools/matrix.py`, run",
        "with TFDTAPE_ALLOW_UNTESTED_TENSORFLOW=1.",
        "",
        TABLE_HEADER,
        "|---|---|---|---|---|---|",
        *sorted(rows.values(), key=_row_order),
    ]
    output.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _row_order(row):
    """Releases by version number, then the nightly builds."""
    name = row.split(" | ")[0].removeprefix("| ")
    if re.fullmatch(r"[\d.]+", name):
        return (0, tuple(int(part) for part in name.split(".")), "")
    return (1, (), name)


def passed(outcome):
    """Whether a build's row counts as a pass (a nightly the registry no
    longer serves is skipped, not failed)."""
    if outcome.installed == "not served":
        return True
    checks_passed, _, checks_run = outcome.verify.partition("/")
    return (outcome.verify.endswith(" passed") and
            checks_run.split()[0] == checks_passed and
            " passed" in outcome.tests and "failed" not in outcome.tests and
            "error" not in outcome.tests and "exit" not in outcome.tests)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", nargs="*",
                        help="releases to check (default: newest patch of "
                             "each tested minor release; none with --nightly "
                             "alone)")
    parser.add_argument("--nightly", action="store_true",
                        help="also check the pinned nightly builds")
    parser.add_argument("--per-release", action="store_true",
                        help="run the tests whose outcome can depend on the "
                             "release, and the proof that they run every patch "
                             "target and compat accessor (CI's version stages), "
                             "instead of the whole suite")
    parser.add_argument("--workdir", type=pathlib.Path,
                        default=pathlib.Path("/tmp/tfdtape-matrix"))
    parser.add_argument("--output", type=pathlib.Path,
                        default=ROOT / "docs" / "compatibility.md")
    args = parser.parse_args(argv)
    if args.versions is None:
        releases = [] if args.nightly else available_releases()
    else:
        releases = args.versions
    untested = [v for v in releases if not versions.is_tested(v)]
    if untested:
        parser.error(f"not tested releases ({versions.TESTED_RANGE_TEXT}): "
                     f"{', '.join(untested)}; --nightly checks the nightly "
                     "builds")
    builds = [release_build(version) for version in releases]
    if args.nightly:
        builds.append(nightly_build())
    args.workdir.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short",
                             "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    source = snapshot(args.workdir)
    outcomes = []
    for build in builds:
        outcome = check_build(build, args.workdir, source, args.per_release)
        if outcome.installed == "not served":
            print(f"{build.name}: skipped: {outcome.notes[0]}", flush=True)
        else:
            print(f"{build.name}: install {outcome.installed}, tests "
                  f"{outcome.tests}, verify {outcome.verify} "
                  f"({outcome.minutes:.1f} min)", flush=True)
            for line in outcome.failed_tests:
                print(f"  {line}", flush=True)
            print("  slowest tests:", flush=True)
            for line in outcome.slowest:
                print(f"    {line}", flush=True)
        outcomes.append(outcome)
    write_table([o for o in outcomes if o.installed != "not served"],
                args.output, commit)
    print(f"wrote {args.output}")
    return 0 if all(map(passed, outcomes)) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
