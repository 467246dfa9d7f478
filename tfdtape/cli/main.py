"""`python -m tfdtape verify|info|run|launch`, or `tfdtape ...` (the
console script, the same entry): the command line's entry.

verify   runs every check in every configuration on MirroredStrategy over
         virtual CPUs (tfdtape.cli.verify_command).
info     lists versions, TensorFlow's resolution and the patch targets
         (tfdtape.cli.info_command).
run      runs a script or module with tfdtape installed and reports what its
         gradient tapes did (tfdtape.cli.run_command).
launch   starts the processes of a multi-worker job on this host, as
         horovodrun does (tfdtape.cli.launch_command).

`--version` prints tfdtape's release.

Exit status: 0 success (every check passed), 1 a check failed, 2 the command
could not run (bad arguments, no usable TensorFlow, an unwritable report
path), with one line on stderr.
"""

import argparse
import os
import sys

from tfdtape import versions
from tfdtape.cli import command_line
from tfdtape.cli import info_command
from tfdtape.cli import launch_command
from tfdtape.cli import run_command
from tfdtape.cli import verify_command


def _parser():
    parser = argparse.ArgumentParser(
        prog=command_line.program_name(),
        description="Verify tfdtape's patch against the installed TensorFlow.")
    parser.add_argument("--version", action="version",
                        version=f"tfdtape {versions.RELEASE}")
    commands = parser.add_subparsers(dest="command", required=True)
    verify_command.add_arguments(
        commands.add_parser("verify", help="run the semantic checks"))
    commands.add_parser("info", help="show versions and patch targets")
    commands.add_parser(
        "run", help="run a script (or -m module) and report what its tapes did",
        description=run_command.__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter, add_help=False)
    commands.add_parser(
        "launch", help="start the processes of a multi-worker job (as horovodrun)",
        description=launch_command.__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter, add_help=False)
    return parser


def main(argv=None):
    """Runs the command line; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["run"]:  # The script's own arguments are not ours to parse.
        return _report_usage_errors(run_command.run, argv[1:])
    if argv[:1] == ["launch"]:  # Nor the launched command's.
        return _report_usage_errors(launch_command.run, argv[1:])
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_request:
        return (command_line.EXIT_UNUSABLE if exit_request.code
                else command_line.EXIT_PASSED)
    # TensorFlow's start-up chatter is noise in verify's and info's reports
    # (run leaves the environment to the script it runs).
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if args.command == "verify":
        return _report_usage_errors(verify_command.run, args, argv)
    return _report_usage_errors(info_command.run, args)


def _report_usage_errors(command, *arguments):
    """Runs `command`; a UsageError becomes one line on stderr and exit 2."""
    try:
        return command(*arguments)
    except command_line.UsageError as error:
        print(f"tfdtape: {error}", file=sys.stderr)
        return command_line.EXIT_UNUSABLE
