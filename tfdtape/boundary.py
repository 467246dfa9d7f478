"""tfdtape's boundary: an error TensorFlow raises inside tfdtape's own code
comes out as tfdtape's.

tfdtape's replacements call into TensorFlow with the program's values (a
strategy's devices, a reduction, a variable's components). Where such a
call fails for a reason of the program's, TensorFlow's message names an
internal the user never called. Inside `translated(...)` an exception of a
plain Python type (`TRANSLATED`) that is not tfdtape's own is raised again
with the same type and a message of `errors.message`'s shape (what tfdtape
was doing, TensorFlow's error, what to do), the original chained as its
cause, and reported to the event bus as a refusal. tfdtape's own errors
(their messages begin "tfdtape: "), TensorFlow's op errors
(`tf.errors.OpError`, raised by running ops: the program's values) and any
other type pass through unchanged.

Only tfdtape's own steps go inside: a call of the function tfdtape replaced
stays outside, so its errors stay TensorFlow's, as on stock TensorFlow.
"""

import contextlib

from tfdtape import errors
from tfdtape import events

TRANSLATED = (ValueError, TypeError, RuntimeError, AttributeError, KeyError,
              IndexError, NotImplementedError)
"""The exception types raised again as tfdtape's (exactly these: a subclass
may need other arguments)."""

REPORT = ("If the program is right, this is a case tfdtape does not handle: "
          "report it to tfdtape with the program; meanwhile "
          "tfdtape.uninstall() gives TensorFlow's own behaviour")
"""What to do, where nothing more specific can be said."""


@contextlib.contextmanager
def translated(doing, symbol, remedy=REPORT):
    """Raises an error of TRANSLATED from inside the block as tfdtape's.

    Args:
        doing: what tfdtape was doing, e.g. "recording a reduction for the
            tape"; the message says "cannot finish <doing>".
        symbol: the TensorFlow API the program called.
        remedy: what to do.
    """
    try:
        yield
    except TRANSLATED as error:
        if type(error) not in TRANSLATED or _is_tfdtapes(error):
            raise
        text = str(error).strip()
        first = text.splitlines()[0] if text else "(no message)"
        raise events.refused(type(error)(errors.message(
            f"cannot finish {doing}", symbol,
            "TensorFlow to accept what tfdtape passed on from the program",
            f"{type(error).__name__} from TensorFlow: {first}", remedy))) from error


def _is_tfdtapes(error):
    return any(line.lstrip().startswith("tfdtape: ")
               for line in str(error).splitlines())
