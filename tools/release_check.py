"""Builds tfdtape's release artifacts from a clean checkout and checks them.

1. `python -m build` on a clean copy of the repository (git's tracked files
   and the new ones it does not ignore) gives one sdist and one wheel;
2. `twine check` passes on both;
3. the sdist holds the package, the pytest plugin, the tests, the docs,
   README.md, CHANGELOG.md and LICENSE, and both carry LICENSE in their
   metadata (`License-File`);
4. a fresh virtual environment installs the sdist (not the wheel) with
   TensorFlow (`[cpu]`), and `tfdtape verify` passes there;
5. where TFDTAPE_HOROVOD_SOURCE names a Horovod checkout, Horovod's own
   test files pass against tfdtape.horovod (tests/test_horovod_suite.py).

Usage: python tools/release_check.py [--workdir DIR] [--skip-install]
Exit status 0 when every step passed, 1 when one failed (the step says why).
"""

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import venv
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
SDIST_MUST_HOLD = ("tfdtape/__init__.py", "tfdtape_pytest.py", "tests/conftest.py",
                   "tfdtape/cli/main.py", "docs/strategies.md", "README.md",
                   "CHANGELOG.md", "CONTRIBUTING.md", "LICENSE",
                   "setup.py", "pyproject.toml")
"""Paths (below the sdist's top folder) a release must carry."""


class CheckFailed(Exception):
    """A step failed; the message says which and why."""


def clean_copy(destination):
    """Copies what a clean clone holds (tracked and new unignored files)."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
         "--exclude-standard"], capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


def step(name, command, **kwargs):
    """Runs `command`; raises CheckFailed with its output if it fails."""
    print(f"--- {name}", flush=True)
    completed = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if completed.returncode != 0:
        raise CheckFailed(f"{name} failed (exit {completed.returncode}):\n"
                          f"{completed.stdout[-3000:]}{completed.stderr[-3000:]}")
    return completed


def check_contents(sdist, wheel):
    """Raises CheckFailed unless the artifacts hold what a release must."""
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
        top = names[0].split("/")[0]
        held = {name[len(top) + 1:] for name in names}
        metadata = archive.extractfile(f"{top}/PKG-INFO").read().decode()
    missing = [path for path in SDIST_MUST_HOLD if path not in held]
    if missing:
        raise CheckFailed(f"the sdist lacks {', '.join(missing)}")
    with zipfile.ZipFile(wheel) as archive:
        wheel_names = archive.namelist()
        info = next(name.split("/")[0] for name in wheel_names
                    if name.split("/")[0].endswith(".dist-info"))
        wheel_metadata = archive.read(f"{info}/METADATA").decode()
    for artifact, text in (("sdist", metadata), ("wheel", wheel_metadata)):
        if "License-File: LICENSE" not in text:
            raise CheckFailed(f"the {artifact}'s metadata names no License-File")
    if not any(name.endswith("LICENSE") and name.startswith(info)
               for name in wheel_names):
        raise CheckFailed("the wheel carries no LICENSE")
    print(f"    sdist: {len(held)} files; wheel: {len(wheel_names)} files")


def horovod_suite(source):
    """Runs Horovod's own test files against tfdtape.horovod (the slow
    tests/test_horovod_suite.py) where TFDTAPE_HOROVOD_SOURCE names a
    Horovod checkout; says it did not where none is named."""
    if not os.environ.get("TFDTAPE_HOROVOD_SOURCE"):
        print("release check: Horovod's own tests not run (TFDTAPE_HOROVOD_SOURCE "
              "names no Horovod checkout)")
        return
    step("Horovod's own tests", [sys.executable, "-m", "pytest", "-q", "-m", "slow",
                                 "-p", "no:cacheprovider", "tests/test_horovod_suite.py"],
         cwd=source, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=pathlib.Path)
    parser.add_argument("--skip-install", action="store_true",
                        help="stop after the artifacts' checks")
    arguments = parser.parse_args(argv)
    workdir = arguments.workdir or pathlib.Path(tempfile.mkdtemp(prefix="release-"))
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    try:
        source = clean_copy(workdir / "checkout")
        dist = workdir / "dist"
        step("python -m build", [sys.executable, "-m", "build", "--outdir",
                                 str(dist), str(source)])
        sdists, wheels = sorted(dist.glob("*.tar.gz")), sorted(dist.glob("*.whl"))
        if len(sdists) != 1 or len(wheels) != 1:
            raise CheckFailed(f"expected one sdist and one wheel, found "
                              f"{[p.name for p in dist.iterdir()]}")
        step("twine check", [sys.executable, "-m", "twine", "check", "--strict",
                             str(sdists[0]), str(wheels[0])])
        check_contents(sdists[0], wheels[0])
        if not arguments.skip_install:
            environment = workdir / "fresh"
            venv.create(environment, with_pip=True)
            python = str(environment / "bin" / "python")
            step("pip install the sdist with TensorFlow",
                 [python, "-m", "pip", "install", "-q", f"{sdists[0]}[cpu]"])
            step("tfdtape verify", [str(environment / "bin" / "tfdtape"), "verify"],
                 env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), cwd=workdir)
        horovod_suite(source)
    except CheckFailed as failure:
        print(f"release check: {failure}", file=sys.stderr)
        return 1
    print(f"release check: passed ({sdists[0].name}, {wheels[0].name})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
