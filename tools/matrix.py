"""Runs tfdtape's tests and `verify` on every supported tensorflow-cpu release.

For each release (by default the newest patch of every minor release in
tfdtape's supported range that pip can install here), it creates an isolated
virtual environment, installs that tensorflow-cpu and tfdtape, runs the test
suite and `python -m tfdtape verify --json`, and writes the table of results
to docs/compatibility.md.

Usage:
  python tools/matrix.py [--versions 2.12.1 2.21.0] [--workdir DIR]
                         [--output docs/compatibility.md]
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


@dataclasses.dataclass
class Outcome:
    """What one TensorFlow release gave."""
    version: str
    installed: str = "not tried"
    tests: str = "not run"
    verify: str = "not run"
    notes: list = dataclasses.field(default_factory=list)
    minutes: float = 0.0


def available_releases():
    """Newest patch of each minor release pip offers in the supported range."""
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "tensorflow-cpu"],
        capture_output=True, text=True, check=True).stdout
    found = re.search(r"Available versions: (.*)", listing).group(1).split(", ")
    newest = {}
    for version in found:
        if not re.fullmatch(r"\d+\.\d+\.\d+", version):
            continue  # pre-releases and post-releases
        if not versions.is_supported(version):
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


def check_release(version, workdir, source):
    """Installs tensorflow-cpu==version in a fresh venv and runs everything
    from the `source` tree."""
    outcome = Outcome(version)
    started = time.monotonic()
    env_dir = workdir / f"tf-{version}"
    log = workdir / f"tf-{version}.log"
    log.write_text("")
    venv.create(env_dir, with_pip=True, clear=True)
    python = env_dir / "bin" / "python"
    install = run([python, "-m", "pip", "install", "-q",
                   f"tensorflow-cpu=={version}"], log)
    if install.returncode == 0:
        install = run([python, "-m", "pip", "install", "-q", "-e",
                       f"{source}[test]"], log)
    if install.returncode == 0 and versions.parse_release(version) >= (2, 16):
        # Keras 2 for TensorFlow 2.16+, beside tensorflow-cpu: tf_keras
        # requires the `tensorflow` distribution, so it goes in without deps.
        major, minor = versions.parse_release(version)
        install = run([python, "-m", "pip", "install", "-q", "--no-deps",
                       f"tf_keras~={major}.{minor}.0"], log)
    outcome.installed = "yes" if install.returncode == 0 else "failed"
    if install.returncode != 0:
        outcome.notes.append(f"pip failed, see {log.name}")
        return outcome
    env = {"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": f"{env_dir / 'bin'}:/usr/bin:/bin"}
    tests = run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                 str(source / "tests")], log, cwd=source, env=env)
    summary = PYTEST_SUMMARY.findall(log.read_text())
    outcome.tests = summary[-1] if summary else f"exit {tests.returncode}"
    report_path = workdir / f"tf-{version}-verify.json"
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


def write_table(outcomes, output, commit):
    lines = [
        "# Compatibility",
        "",
        "Generated by `python tools/matrix.py` (do not edit by hand): for each",
        "tensorflow-cpu release, a fresh virtual environment on Python "
        f"{sys.version.split()[0]}, the",
        "test suite (`pytest tests`) and `python -m tfdtape verify`, all on the",
        f"committed tree ({commit}).",
        "",
        "| tensorflow-cpu | install | tests | verify | notes |",
        "|---|---|---|---|---|",
    ]
    for outcome in outcomes:
        notes = "; ".join(outcome.notes).replace("|", "\\|") or "-"
        lines.append(f"| {outcome.version} | {outcome.installed} | "
                     f"{outcome.tests} | {outcome.verify} | {notes} |")
    output.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", nargs="+",
                        help="releases to check (default: newest patch of "
                             "each supported minor release)")
    parser.add_argument("--workdir", type=pathlib.Path,
                        default=pathlib.Path("/tmp/tfdtape-matrix"))
    parser.add_argument("--output", type=pathlib.Path,
                        default=ROOT / "docs" / "compatibility.md")
    args = parser.parse_args(argv)
    releases = args.versions or available_releases()
    unsupported = [v for v in releases if not versions.is_supported(v)]
    if unsupported:
        parser.error(f"outside {versions.TENSORFLOW_REQUIREMENT}: "
                     f"{', '.join(unsupported)}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short",
                             "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    source = snapshot(args.workdir)
    outcomes = []
    for version in releases:
        outcome = check_release(version, args.workdir, source)
        print(f"{version}: install {outcome.installed}, tests {outcome.tests}, "
              f"verify {outcome.verify} ({outcome.minutes:.1f} min)", flush=True)
        outcomes.append(outcome)
    write_table(outcomes, args.output, commit)
    print(f"wrote {args.output}")
    return 0 if all(o.verify.endswith("passed") and "failed" not in o.tests
                    for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
