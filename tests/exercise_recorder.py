"""Which of tfdtape's functions a test process ran, and which of `compat`'s
names it read: the evidence that the version stages (`--per-release`)
exercise every patch target and every compat accessor.

`instrument(modules)` recompiles each module's source with one statement
first in every function body, adding the function's key to `hits`, and
gives every function object the module holds (module functions, methods,
properties, the functions behind decorators) the recompiled code in place:
the same objects, the same file, line numbers and globals, so that
tracebacks, AutoGraph and tfdtape's own identity checks see no difference.
Closures made afterwards (each install's replacements) run the recompiled
code; one made before keeps the code it was made with, so the caller
reinstalls tfdtape after instrumenting.

`watch_reads(module)` records the names read from a module object
(`compat.strategy_context`, ...) from then on.
"""

import ast
import inspect
import os
import types

ENVIRONMENT = "TFDTAPE_RECORD_EXERCISE"
"""Set to a directory by `pytest --record-exercise`: the worker processes
tests/loopback.py starts record there too (tests/recorded_process.py)."""

HITS = "_tfdtape_exercise_hits_"
"""The global each instrumented module holds its hits set under."""

hits = set()
"""Keys (`code_key`) of the instrumented functions that have run."""

reads = set()
"""(module name, attribute) read from a watched module."""

_made = set()
"""The code objects `instrument` made: a function holding another one was
redefined since (`importlib.reload`)."""


def code_key(code):
    """A function's key: its file, the line its code starts on (its first
    decorator's) and its name, the same for the code before and after
    `instrument`."""
    return f"{code.co_filename}:{code.co_firstlineno}:{code.co_name}"


class _KeyedBodies(ast.NodeTransformer):
    """Puts `HITS.add(key)` first in every function body (after a
    docstring, which stays the docstring)."""

    def __init__(self, filename):
        self.filename = filename

    def _visit_function(self, node):
        self.generic_visit(node)
        first_line = min([node.lineno] + [d.lineno for d in node.decorator_list])
        key = f"{self.filename}:{first_line}:{node.name}"
        body = node.body
        docstring = (body and isinstance(body[0], ast.Expr) and
                     isinstance(body[0].value, ast.Constant) and
                     isinstance(body[0].value.value, str))
        anchor = body[1] if docstring and len(body) > 1 else body[0]
        record = ast.parse(f"{HITS}.add({key!r})").body[0]
        for child in ast.walk(record):
            ast.copy_location(child, anchor)
        body.insert(1 if docstring else 0, record)
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = _visit_function


def _compiled_functions(module):
    """{key: code} of every function in the recompiled source of `module`."""
    filename = inspect.getsourcefile(module)
    tree = _KeyedBodies(filename).visit(ast.parse(inspect.getsource(module)))
    found = {}
    pending = [compile(tree, filename, "exec")]
    while pending:
        code = pending.pop()
        for constant in code.co_consts:
            if isinstance(constant, types.CodeType):
                found[code_key(constant)] = constant
                pending.append(constant)
    return found


def _functions_held(module):
    """The function objects `module` holds at module level and in its
    classes, with the functions behind their decorators."""
    candidates = list(vars(module).values())
    for value in list(candidates):
        if isinstance(value, type) and value.__module__ == module.__name__:
            candidates += list(vars(value).values())
    seen = {}
    while candidates:
        value = candidates.pop()
        if isinstance(value, (staticmethod, classmethod)):
            candidates.append(value.__func__)
        elif isinstance(value, property):
            candidates += [value.fget, value.fset, value.fdel]
        elif isinstance(value, types.FunctionType) and id(value) not in seen:
            seen[id(value)] = value
            if hasattr(value, "__wrapped__"):
                candidates.append(value.__wrapped__)
    return [function for function in seen.values()
            if function.__globals__ is vars(module)]


def instrument(modules):
    """Makes every function of `modules` record its key in `hits` when it
    runs; returns how many function objects now do."""
    count = 0
    for module in modules:
        compiled = _compiled_functions(module)
        vars(module)[HITS] = hits
        _made.update(compiled.values())
        for function in _functions_held(module):
            code = compiled.get(code_key(function.__code__))
            if code is not None and code.co_freevars == function.__code__.co_freevars:
                function.__code__ = code
                count += 1
    return count


def _reloaded(module):
    """Whether `module` holds a function of its own not instrumented (a
    reload defined it again)."""
    return any(type(value) is types.FunctionType and value.__globals__ is vars(module)
               and value.__code__ not in _made for value in vars(module).values())


def watch_reads(module):
    """Records in `reads` every attribute read from `module` (the module
    object: `from module import name` copies are not seen)."""
    name = module.__name__

    class Watched(types.ModuleType):
        def __getattribute__(self, attribute):
            reads.add((name, attribute))
            return super().__getattribute__(attribute)

    module.__class__ = Watched


def accessors(module):
    """The names `module` binds other than by a plain import at its top
    level: for `tfdtape.compat`, its accessors (`strategy_context`,
    `Tensor`, ...), whichever branch of a release check binds them."""
    tree = ast.parse(inspect.getsource(module))
    names = []
    for statement in tree.body:
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(statement, (ast.FunctionDef, ast.ClassDef)):
            names.append(statement.name)
            continue
        for node in ast.walk(statement):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.append(node.id)
            elif isinstance(node, ast.alias):
                names.append(node.asname or node.name.split(".")[0])
    return sorted({name for name in names if not name.startswith("_")})


def start():
    """Instruments every tfdtape module loaded (and the command line's
    modules that hold scoped patch targets), reinstalls tfdtape where it is
    installed so that its replacements run the recorded code, and watches
    `tfdtape.compat`."""
    import sys

    import tfdtape
    from tfdtape import compat
    from tfdtape.cli import info_command
    info_command.scoped_patch_targets()  # imports the modules that make them
    instrument([module for name, module in list(sys.modules.items())
                if (name == "tfdtape" or name.startswith("tfdtape."))
                and getattr(module, "__file__", None)])
    if tfdtape.is_installed():
        tfdtape.uninstall()
        tfdtape.install()
    watch_reads(compat)


def _replacement_key(function):
    """The key of tfdtape's own function in a replacement: TensorFlow's
    `filter_traceback` wraps two of them (tfdtape.frame_filters)."""
    import tfdtape
    package = os.path.dirname(tfdtape.__file__) + os.sep
    while (not function.__code__.co_filename.startswith(package)
           and hasattr(function, "__wrapped__")):
        function = function.__wrapped__
    return code_key(function.__code__)


def refresh():
    """Instruments again the tfdtape modules a test reloaded, and reinstalls
    tfdtape where it is installed (its replacements were made of the
    reloaded functions); a test calls this before it runs."""
    import sys

    import tfdtape
    reloaded = [module for name, module in list(sys.modules.items())
                if name.startswith("tfdtape") and vars(module).get(HITS) is hits
                and _reloaded(module)]
    if reloaded:
        instrument(reloaded)
        if tfdtape.is_installed():
            tfdtape.uninstall()
            tfdtape.install()


def report():
    """What this process ran, as JSON data: its TensorFlow; the key of each
    function that ran; the compat accessors and those read; and the key of
    each patch target's replacement (installed ones as installed, scoped
    ones as their maker makes them)."""
    import tensorflow as tf

    from tfdtape import compat
    from tfdtape import targets
    from tfdtape.cli import info_command
    installed = {target.symbol: _replacement_key(target.current())
                 for target in targets.patch_targets()
                 if target.holder() == targets.TFDTAPE}
    scoped = {target.symbol: _replacement_key(target.make_replacement(target.check()))
              for target in info_command.scoped_patch_targets()
              if target.holder() != targets.MISSING}
    compat_name = compat.__name__
    return {"tensorflow": tf.__version__,
            "hits": sorted(set(hits)),
            "compat_accessors": accessors(compat),
            "compat_reads": sorted(attribute for module, attribute in list(reads)
                                   if module == compat_name),
            "targets": installed,
            "scoped_targets": scoped}


def write(directory, name):
    """Writes `report()` to DIRECTORY/NAME.json."""
    import json
    import pathlib
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.json").write_text(json.dumps(report()), encoding="utf-8")
