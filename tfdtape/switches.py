"""On/off settings that tfdtape reads from environment variables.

Every switch understands the same words (1/true/yes/on, 0/false/no/off, any
case, surrounding blanks ignored; an empty value is the default, as unset)
and refuses anything else rather than guess.
This module must not import TensorFlow.
"""

import os

AUTOINSTALL = "TFDTAPE_AUTOINSTALL"
"""Whether `import tfdtape` installs the patch (default on)."""

ALLOW_UNTESTED_TENSORFLOW = "TFDTAPE_ALLOW_UNTESTED_TENSORFLOW"
"""Whether `install()` accepts a TensorFlow release tfdtape was not tested on
(default off)."""

INDEPENDENT_PROCESSES = "TFDTAPE_INDEPENDENT_PROCESSES"
"""Whether the processes a launcher (Slurm, MPI) started are separate jobs,
one each (default off: they are one job)."""

_WORDS = {"1": True, "true": True, "yes": True, "on": True,
          "0": False, "false": False, "no": False, "off": False}


def read(variable, default, remedy, environ=None):
    """The switch `variable`'s value in `environ` (default: this process's
    environment), `default` when it is unset or empty.

    Raises:
        ValueError: the variable holds a word not understood; the message
            ends with `remedy`.
    """
    raw = (os.environ if environ is None else environ).get(variable)
    if raw is None or not raw.strip():  # unset, or set to nothing
        return default
    choice = _WORDS.get(raw.strip().lower())
    if choice is None:
        raise ValueError(
            f"tfdtape: {variable}={raw!r} is not understood: expected one of "
            f"{', '.join(sorted(_WORDS))}. {remedy.rstrip('.')}")
    return choice
