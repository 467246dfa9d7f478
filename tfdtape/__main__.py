"""`python -m tfdtape verify|info`: check the installed TensorFlow against the commit.

verify   runs every check in every configuration on MirroredStrategy over
         virtual CPUs; exit 0 iff all pass, 1 if any fails, 2 on bad
         arguments or an unusable environment.
info     lists versions, patch targets and what tfdtape would do.
"""

import argparse
import os
import platform
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

EXIT_PASSED, EXIT_FAILED, EXIT_UNUSABLE = 0, 1, 2
MAX_REPLICAS = 64


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m tfdtape",
        description="Verify tfdtape's patch against the installed TensorFlow.")
    commands = parser.add_subparsers(dest="command", required=True)
    verify = commands.add_parser("verify", help="run the semantic checks")
    verify.add_argument("--replicas", type=int, default=4,
                        help="virtual CPU devices / replicas (default 4, 2 to 64)")
    verify.add_argument("--json", metavar="PATH", help="write results as JSON")
    verify.add_argument("--junit", metavar="PATH", help="write JUnit XML")
    verify.add_argument("--only", metavar="NAME", action="append",
                        help="run only this check (repeatable)")
    verify.add_argument("--list", action="store_true",
                        help="list the checks and exit")
    commands.add_parser("info", help="show versions and patch targets")
    return parser


class UsageError(Exception):
    """A one-line problem with the arguments or the environment."""


def _import_tensorflow():
    try:
        import tensorflow  # pylint: disable=g-import-not-at-top
    except ImportError as error:
        raise UsageError(
            f"TensorFlow cannot be imported ({error}). Install it with "
            "`pip install tfdtape[cpu]` or `pip install tfdtape[tensorflow]`"
        ) from None
    from tfdtape import versions  # pylint: disable=g-import-not-at-top
    if not versions.is_supported(tensorflow.__version__):
        raise UsageError(
            f"TensorFlow {tensorflow.__version__} is not supported: expected a "
            f"release in {versions.TENSORFLOW_REQUIREMENT}")
    return tensorflow


def _environment(tf, devices):
    from tfdtape import testing  # pylint: disable=g-import-not-at-top
    return {"tensorflow": tf.__version__,
            "python": platform.python_version(),
            "devices": devices,
            "native_resolver": testing.native_resolver_is_registered(),
            "native_resolution": testing.native_resolution_description()}


def _selected_checks(only):
    from tfdtape import checks  # pylint: disable=g-import-not-at-top
    if not only:
        return list(checks.CHECKS)
    by_name = {check.name: check for check in checks.CHECKS}
    unknown = [name for name in only if name not in by_name]
    if unknown:
        raise UsageError(f"unknown check {', '.join(unknown)}; "
                         f"`python -m tfdtape verify --list` lists them")
    return [by_name[name] for name in only]


def _verify(args, argv):
    if not 2 <= args.replicas <= MAX_REPLICAS:
        raise UsageError(f"--replicas must be between 2 and {MAX_REPLICAS}, "
                         f"found {args.replicas}")
    tf = _import_tensorflow()
    checks = _selected_checks(args.only)
    if args.list:
        for check in checks:
            print(f"{check.name:34} {check.description}")
        return EXIT_PASSED
    from tfdtape import testing  # pylint: disable=g-import-not-at-top
    from tfdtape import verify  # pylint: disable=g-import-not-at-top
    try:
        devices = testing.virtual_cpus(args.replicas)
    except RuntimeError:
        # This process's runtime started with another layout: use a fresh one.
        return subprocess.call([sys.executable, "-m", "tfdtape", *argv])
    tf.get_logger().setLevel("ERROR")  # retracing and eager-strategy advice
    strategy = tf.distribute.MirroredStrategy(devices)
    width = max(len(check.name) for check in checks)
    results = []
    for check in checks:
        results.append(verify.run_check(check, strategy))
        print(verify.result_line(results[-1], width), flush=True)
    environment = _environment(tf, devices)
    print()
    print("\n".join(verify.summary_lines(results, environment)))
    if args.json:
        verify.write_json(args.json, results, environment)
    if args.junit:
        verify.write_junit(args.junit, results, environment)
    passed = all(result.status == verify.PASS for result in results)
    return EXIT_PASSED if passed else EXIT_FAILED


def _info():
    tf = _import_tensorflow()
    from tfdtape import compat  # pylint: disable=g-import-not-at-top
    from tfdtape import defun  # pylint: disable=g-import-not-at-top
    from tfdtape import errors  # pylint: disable=g-import-not-at-top
    from tfdtape import patching  # pylint: disable=g-import-not-at-top
    from tfdtape import targets  # pylint: disable=g-import-not-at-top
    from tfdtape import testing  # pylint: disable=g-import-not-at-top
    from tfdtape import versions  # pylint: disable=g-import-not-at-top
    print(f"tfdtape {versions.RELEASE} (supports TensorFlow "
          f"{versions.TENSORFLOW_REQUIREMENT})")
    print(f"TensorFlow {tf.__version__}, Python {platform.python_version()}")
    print(f"TensorFlow's native resolver: "
          f"{testing.native_resolution_description()}"
          + (" (one-shot hook, no unregister)" if compat.HAS_RESOLVER_REGISTRY
             else ""))
    resolving = defun.classes_with_captured_input_resolution()
    print("defun captured-input resolution: " + (
        ", ".join(cls.__qualname__ for cls in resolving) if resolving
        else "absent (removed upstream, as the commit did)"))
    print(f"installed in this process: {'yes' if patching.is_installed() else 'no'}"
          " (`import tfdtape` installs)")
    try:
        planned = {target.symbol for target in patching.preflight()}
        print("install check: OK")
    except errors.UnsupportedTensorFlowError as error:
        planned = set()
        print(f"install check: FAILED: {error}")
    print("patch targets:")
    for target in targets.patch_targets():
        current = target.current()
        if current is None:
            holder = "missing"
        elif getattr(current, "__module__", "").startswith("tfdtape."):
            holder = "tfdtape's"
        elif getattr(current, "__module__", "").startswith("tensorflow."):
            holder = "TensorFlow's original"
        else:
            holder = f"something else's ({getattr(current, '__module__', '?')})"
        action = "patched on install" if target.symbol in planned else "left alone"
        print(f"  {target.symbol}: {holder}; {action}")
    return EXIT_PASSED


def main(argv=None):
    """Runs the command line; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_request:
        return EXIT_UNUSABLE if exit_request.code else EXIT_PASSED
    try:
        if args.command == "verify":
            return _verify(args, argv)
        return _info()
    except UsageError as error:
        print(f"tfdtape: {error}", file=sys.stderr)
        return EXIT_UNUSABLE


if __name__ == "__main__":
    sys.exit(main())
