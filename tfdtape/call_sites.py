"""Where in the user's code a gradient was asked for: the `file:line` that
`tfdtape.trace()` and `python -m tfdtape run` report for a None gradient or
a cross-replica total derivative.

The location is the innermost frame that is user code. Inside a
`tf.function`, AutoGraph runs generated code; TensorFlow keeps a source map
from it back to the user's lines for each conversion under way
(`tf_stack`'s source-mapper stacks, one per thread), and this module reads
those maps.
"""

import ast
import functools
import linecache
import os
import sys
import sysconfig

from tensorflow.python.util import tf_stack


def caller_location(frame):
    """'file:line' of the innermost frame from `frame` outwards that is user
    code, or '?' if there is none. The line is the first of the statement
    that frame is running, so a call spread over lines has one location
    whether it runs eagerly or converted by AutoGraph.

    Frames in TensorFlow's, Keras's and tfdtape's package folders and in the
    standard library (a replica thread's `threading` frames) are not user
    code. A frame in AutoGraph's generated code stands for the statement of
    the user's function it was converted from, found through TensorFlow's
    source maps of the conversions under way (in any thread: a replica
    function converted with its caller runs in a replica thread); a
    generated frame no map covers gives '?', since the line it stands for
    is unknown.
    """
    libraries = _library_folders()
    while frame is not None:
        filename = frame.f_code.co_filename
        if "__autograph_generated" in filename:
            origin = _autograph_origin(filename, frame.f_lineno)
            if origin is None:
                return "?"
            if _is_user_file(origin[0], libraries):
                return f"{origin[0]}:{_statement_start(origin[0], origin[1])}"
        elif _is_user_file(filename, libraries):
            return f"{filename}:{_statement_start(filename, frame.f_lineno)}"
        frame = frame.f_back
    return "?"


def _is_user_file(filename, libraries):
    if filename.startswith(libraries) or filename.startswith("<frozen "):
        return False
    return not (filename.startswith(_standard_library_folders()) and
                "site-packages" not in filename and
                "dist-packages" not in filename)


def _library_folders():
    """The folders of the loaded packages whose frames are not user code."""
    folders = []
    for name in ("tensorflow", "keras", "tf_keras", "tfdtape"):
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if path:
            folders.append(os.path.dirname(path) + os.sep)
    return tuple(folders)


@functools.cache
def _standard_library_folders():
    paths = sysconfig.get_paths()
    return tuple({os.path.join(paths[key], "") for key in ("stdlib", "platstdlib")})


def _autograph_origin(filename, line):
    """(file, line, function) that line `line` of AutoGraph's generated
    `filename` was converted from, or None: looked up in the source maps of
    the conversions under way, this thread's first."""

    stacks = tf_stack._source_mapper_stacks
    own = stacks.get(tf_stack._get_thread_key())
    for stack in [own] + list(stacks.values()):
        if stack:
            origin = stack[-1].get_effective_source_map().get((filename, line))
            if origin is not None:
                return origin
    return None


def _statement_start(filename, line):
    """The first line of the innermost statement of `filename` that spans
    `line` (Python reports a call spread over lines at the line of its
    callee, AutoGraph's map at its last line)."""
    return _statement_starts(filename).get(line, line)


@functools.lru_cache(maxsize=64)
def _statement_starts(filename):
    """{line: first line of the innermost statement spanning it}."""
    try:
        tree = ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return {}
    starts = {}
    for node in ast.walk(tree):  # the innermost statement starts last
        if isinstance(node, ast.stmt):
            for spanned in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                if starts.get(spanned, 0) <= node.lineno:
                    starts[spanned] = node.lineno
    return starts
