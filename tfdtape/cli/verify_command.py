"""`python -m tfdtape verify`: the checks of `tfdtape.cli.checks` on a
MirroredStrategy over virtual CPUs, reported for people and for CI.

The default report has one line per check (name, verdict, time, one short
observation) and fits in 100 columns; `--verbose` adds every
configuration's observation, as JSON and JUnit reports always have them.
"""

import os
import subprocess
import sys

from tfdtape.cli import command_line

MAX_REPLICAS = 64
REEXEC_VARIABLE = "TFDTAPE_VERIFY_REEXEC"
"""Set in the one fresh process verify may start for its device layout."""
WIDTH = 100


def add_arguments(parser):
    """Adds verify's options to its argparse sub-parser."""
    parser.add_argument("--replicas", type=int, default=4,
                        help=f"virtual CPU devices / replicas (default 4, 2 to "
                             f"{MAX_REPLICAS})")
    parser.add_argument("--json", metavar="PATH", help="write results as JSON")
    parser.add_argument("--junit", metavar="PATH", help="write JUnit XML")
    parser.add_argument("--only", metavar="NAME", action="append",
                        help="run only this check (repeatable)")
    parser.add_argument("--list", action="store_true",
                        help="list the checks and exit")
    parser.add_argument("--verbose", action="store_true",
                        help="show every configuration's observation")
    parser.add_argument("--multi-worker", action="store_true",
                        help="also run the checks that start two worker "
                             "processes on loopback (about a minute)")


def run(args, argv):
    """Runs the checks; returns the exit status.

    Raises:
        command_line.UsageError: bad arguments or an unusable environment,
            found before any check runs.
    """
    if not 2 <= args.replicas <= MAX_REPLICAS:
        raise command_line.UsageError(
            f"--replicas must be between 2 and {MAX_REPLICAS}, found "
            f"{args.replicas}")
    for option, path in (("--json", args.json), ("--junit", args.junit)):
        if path is not None:
            command_line.check_output_path(path, option)
    tf = command_line.import_tensorflow()
    command_line.import_internals(tf, "cli.checks", "testing", "cli.check_runner")
    from tfdtape import release_policy
    release_policy.accept_untested()  # checking a build is verify's job
    checks = _selected_checks(args.only, args.multi_worker)
    if args.list:
        for check in checks:
            print(f"{check.name:38} {check.description}")
        return command_line.EXIT_PASSED
    from tfdtape import testing
    try:
        devices = testing.virtual_cpus(args.replicas)
    except RuntimeError as error:
        return _rerun_in_a_fresh_process(argv, error)
    return _run_checks(tf, checks, devices, args)


def _selected_checks(only, multi_worker):
    """The checks named by --only (each once, in the order given), or all;
    the multi-worker ones only with --multi-worker."""
    from tfdtape.cli import checks
    available = checks.CHECKS + (checks.MULTI_WORKER_CHECKS if multi_worker else ())
    if not only:
        return list(available)
    by_name = {check.name: check for check in available}
    names = list(dict.fromkeys(only))
    unknown = [name for name in names if name not in by_name]
    if unknown:
        opt_in = {check.name for check in checks.MULTI_WORKER_CHECKS}
        hint = (" (it starts worker processes: add --multi-worker)"
                if set(unknown) <= opt_in else "")
        raise command_line.UsageError(
            f"unknown check {', '.join(unknown)}{hint}; "
            f"`{command_line.program_name()} verify --list` lists them")
    return [by_name[name] for name in names]


def _rerun_in_a_fresh_process(argv, error):
    """This process's runtime started with another device layout: runs the
    same command once in a fresh process, and never more than once."""
    if os.environ.get(REEXEC_VARIABLE) == "1":
        reason = str(error).split(": ", 1)[-1].split(". ")[0]
        raise command_line.UsageError(
            f"cannot set up the virtual CPUs even in a fresh process ({reason}): "
            "something runs TensorFlow ops at interpreter start-up (check "
            "sitecustomize, usercustomize and PYTHONSTARTUP)")
    environment = dict(os.environ, **{REEXEC_VARIABLE: "1"})
    sys.stdout.flush()
    return subprocess.call([sys.executable, "-m", "tfdtape", *argv],
                           env=environment)


def _run_checks(tf, checks, devices, args):
    from tfdtape import testing
    from tfdtape.cli import check_runner
    tf.get_logger().setLevel("ERROR")  # retracing and eager-strategy advice
    strategy = tf.distribute.MirroredStrategy(devices)
    from tfdtape import versions
    untested = versions.untested_reason(tf.__version__)
    if untested:  # two lines, each within WIDTH
        print(f"TensorFlow {tf.__version__}: untested ({untested})\n"
              f"tested: {versions.TESTED_RANGE_TEXT}; verify runs every "
              "check anyway", flush=True)
    name_width = max(len(check.name) for check in checks)
    results = []
    for check in checks:
        results.append(check_runner.run_check(check, strategy))
        print(check_runner.result_line(results[-1], name_width, WIDTH,
                                 verbose=args.verbose), flush=True)
    environment = {
        "tensorflow": tf.__version__,
        "tensorflow_untested": versions.untested_reason(tf.__version__),
        "python": _python_version(),
        "devices": devices,
        "native_resolver": testing.native_resolver_is_registered(),
        "native_resolution": testing.native_resolution_description(),
    }
    print()
    print("\n".join(check_runner.summary_lines(results, environment)))
    for path, write in ((args.json, check_runner.write_json),
                        (args.junit, check_runner.write_junit)):
        if path:
            try:
                write(path, results, environment)
            except OSError as error:  # e.g. a full disk, found only now
                raise command_line.UsageError(
                    f"cannot write the report to {path} "
                    f"({error.strerror or error})") from None
    passed = all(result.status == check_runner.PASS for result in results)
    return command_line.EXIT_PASSED if passed else command_line.EXIT_FAILED


def _python_version():
    import platform
    return platform.python_version()
