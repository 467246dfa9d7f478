"""Makes TensorFlow treat tfdtape's code as library code, as it treats its own.

TensorFlow reads three lists for that, each at the time it needs it:
- AutoGraph's `config.CONVERSION_RULES`: modules whose functions a
  `tf.function` calls unconverted (TensorFlow, Keras, NumPy ... are named);
  else a `tape.watch` inside a `tf.function` would run converted copies of
  tfdtape's functions, whose generated frames show in tracebacks;
- `traceback_utils._EXCLUDED_PATHS`: folders whose frames the tracebacks of
  TensorFlow's API functions (those wrapped in `filter_traceback`) and
  AutoGraph's "in user code" lists leave out;
- `tf_stack`'s filter stacks (one per thread): files whose frames the stack
  recorded with each op leaves out, the "defined at" stack of an error at
  run time.
`hide()` puts a `DoNotConvert` rule for tfdtape first in the first, tfdtape's
folder in the second, and the files of tfdtape's modules (with those
`also_hide` names: runpy's, under `python -m tfdtape run`) in the bottom
filter of every thread's stack, threads started later included; `show()`
puts back what TensorFlow had. A TensorFlow without these lists is left
alone: they shape what users read, not what tapes do.

tfdtape's replacements of `GradientTape.watch` and MirroredStrategy's
`call_for_each_replica` are wrapped in `filter_traceback`, so an error passing
through them reaches the user with the user's frames, TensorFlow's one
re-raising frame and the innermost frame (as TensorFlow's own errors keep
theirs).
"""

import os

from tensorflow.python.autograph.core import config as autograph_config
from tensorflow.python.autograph.core import config_lib as autograph_rules
from tensorflow.python.util import tf_stack
from tensorflow.python.util import traceback_utils

from tfdtape import process_state

PACKAGE_FOLDER = os.path.dirname(os.path.abspath(__file__)) + os.sep

# Kept across importlib.reload: what TensorFlow had before hide().
_saved = process_state.kept(globals(), "_saved", lambda: None)
_extra_files = process_state.kept(globals(), "_extra_files", frozenset)
"""(traceback_utils._EXCLUDED_PATHS, tf_stack's default filter factory,
AutoGraph's CONVERSION_RULES) as TensorFlow had them, while tfdtape's are in;
else None."""


class _HiddenFiles(tf_stack.StackTraceFilter):
    """The bottom filter of a thread's stack: leaves out tfdtape's files."""

    def __init__(self, files):
        super().__init__()
        self.parent = None
        self._files = frozenset(files)
        self.update()

    def get_filtered_filenames(self):
        return self._files


def package_files():
    """The file names of tfdtape's modules, as frames name them."""
    return {os.path.join(PACKAGE_FOLDER, name)
            for name in os.listdir(PACKAGE_FOLDER) if name.endswith(".py")}


def also_hide(files):
    """Adds `files` to what `hide()` hides (at once, if hidden now)."""
    global _extra_files
    _extra_files = _extra_files | frozenset(files)
    if _saved is not None:
        hide()


def hide():
    """Leaves tfdtape's folder and files out of what TensorFlow shows;
    calling it again takes in modules loaded since."""
    global _saved
    stacks = getattr(tf_stack, "_source_filter_stacks", None)
    excluded_now = getattr(traceback_utils, "_EXCLUDED_PATHS", None)
    if (not isinstance(excluded_now, tuple) or
            not hasattr(stacks, "default_factory") or
            not isinstance(getattr(autograph_config, "CONVERSION_RULES", None), tuple)):
        return
    if _saved is None:
        _saved = (excluded_now, stacks.default_factory,
                  autograph_config.CONVERSION_RULES)
    excluded, _, rules = _saved
    traceback_utils._EXCLUDED_PATHS = excluded + (PACKAGE_FOLDER,)
    autograph_config.CONVERSION_RULES = (
        autograph_rules.DoNotConvert(__name__.partition(".")[0]),) + rules
    files = frozenset(package_files()) | _extra_files
    stacks.default_factory = lambda: [_HiddenFiles(files)]
    _replace_bottom_filters(lambda: _HiddenFiles(files))


def show():
    """Puts back TensorFlow's own filters (a no-op unless hidden)."""
    global _saved
    if _saved is None:
        return
    excluded, factory, rules = _saved
    traceback_utils._EXCLUDED_PATHS = excluded
    tf_stack._source_filter_stacks.default_factory = factory
    autograph_config.CONVERSION_RULES = rules
    _replace_bottom_filters(tf_stack.SentinelFilter)
    _saved = None


def _replace_bottom_filters(make):
    """Replaces the bottom filter of each thread's stack that holds only
    that one (a stack with more was entered by code that combined its own
    files with the bottom's already, and keeps them until it leaves)."""
    for stack in list(tf_stack._source_filter_stacks.values()):
        if len(stack) == 1 and isinstance(stack[0], (tf_stack.SentinelFilter,
                                                     _HiddenFiles)):
            stack[0] = make()
