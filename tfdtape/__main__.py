"""`python -m tfdtape verify|info`: the command line.

verify   runs every check in every configuration on MirroredStrategy over
         virtual CPUs (tfdtape.verify_command).
info     lists versions, TensorFlow's resolution and the patch targets
         (tfdtape.info_command).

Exit status: 0 success (every check passed), 1 a check failed, 2 the command
could not run (bad arguments, no usable TensorFlow, an unwritable report
path), with one line on stderr.
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tfdtape import command_line  # pylint: disable=g-import-not-at-top
from tfdtape import info_command  # pylint: disable=g-import-not-at-top
from tfdtape import verify_command  # pylint: disable=g-import-not-at-top


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m tfdtape",
        description="Verify tfdtape's patch against the installed TensorFlow.")
    commands = parser.add_subparsers(dest="command", required=True)
    verify_command.add_arguments(
        commands.add_parser("verify", help="run the semantic checks"))
    commands.add_parser("info", help="show versions and patch targets")
    return parser


def main(argv=None):
    """Runs the command line; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_request:
        return (command_line.EXIT_UNUSABLE if exit_request.code
                else command_line.EXIT_PASSED)
    try:
        if args.command == "verify":
            return verify_command.run(args, argv)
        return info_command.run(args)
    except command_line.UsageError as error:
        print(f"tfdtape: {error}", file=sys.stderr)
        return command_line.EXIT_UNUSABLE


if __name__ == "__main__":
    sys.exit(main())
