"""install() / uninstall(): idempotent, atomic, reversible, thread-safe."""

import logging
import os
import subprocess
import sys
import threading

import pytest
import tensorflow as tf
from tensorflow.python.eager import backprop
from tensorflow.python.eager import tape as tape_module

import tfdtape
from tfdtape import targets

pytestmark = pytest.mark.per_release

TAPE_FUNCTIONS = ("watch_variable", "variable_accessed", "variables_accessed")
TAPE_METHODS = ("watch", "gradient")


def current_functions():
    """The patchable attributes as TensorFlow holds them right now."""
    found = {name: vars(tape_module)[name] for name in TAPE_FUNCTIONS}
    found.update({f"GradientTape.{name}": vars(backprop.GradientTape)[name]
                  for name in TAPE_METHODS})
    return found


def assert_tensorflow_originals(functions):
    """Asserts each function is the one TensorFlow's own source defines."""
    for name, function in functions.items():
        assert function.__module__ in ("tensorflow.python.eager.tape",
                                       "tensorflow.python.eager.backprop"), name
        assert "/tensorflow/python/eager/" in function.__code__.co_filename, name


@pytest.fixture
def uninstalled():
    """Runs the test with tfdtape uninstalled; reinstalls afterwards."""
    tfdtape.uninstall()
    yield current_functions()
    tfdtape.install()


def test_install_and_uninstall_are_idempotent(uninstalled):
    assert tfdtape.is_installed() is False
    assert tfdtape.uninstall() is False
    assert tfdtape.install() is True
    assert tfdtape.install() is False
    assert tfdtape.is_installed() is True
    assert tfdtape.uninstall() is True
    assert tfdtape.uninstall() is False
    assert tfdtape.is_installed() is False


def test_uninstall_restores_the_original_objects(uninstalled):
    originals = uninstalled
    assert_tensorflow_originals(originals)
    tfdtape.install()
    patched = current_functions()
    for name in originals:
        assert patched[name] is not originals[name], name
    tfdtape.uninstall()
    restored = current_functions()
    for name in originals:
        assert restored[name] is originals[name], name


def test_signatures_are_kept(uninstalled):
    import inspect
    originals = {name: inspect.signature(f) for name, f in uninstalled.items()}
    tfdtape.install()
    for name, function in current_functions().items():
        assert inspect.signature(function) == originals[name], name


def test_concurrent_install_and_uninstall(uninstalled):
    originals = uninstalled
    threads_count = 8
    barrier = threading.Barrier(threads_count)
    outcomes = {"install": [], "uninstall": []}
    failures = []

    def worker():
        try:
            for _ in range(20):
                barrier.wait()
                outcomes["install"].append(tfdtape.install())
                barrier.wait()
                outcomes["uninstall"].append(tfdtape.uninstall())
        except Exception as error:  # reported below, not swallowed
            failures.append(error)
            barrier.abort()

    threads = [threading.Thread(target=worker) for _ in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert failures == []
    assert outcomes["install"].count(True) == 20
    assert outcomes["uninstall"].count(True) == 20
    assert len(outcomes["install"]) == len(outcomes["uninstall"]) == 160
    restored = current_functions()
    for name in originals:
        assert restored[name] is originals[name], name


def test_patched_context_manager(uninstalled):
    with tfdtape.patched():
        assert tfdtape.is_installed()
    assert not tfdtape.is_installed()
    tfdtape.install()
    with tfdtape.patched():
        assert tfdtape.is_installed()
    assert tfdtape.is_installed()


def test_uninstall_refuses_to_clobber_a_foreign_patch():
    ours = tape_module.watch_variable

    def foreign_watch_variable(tape, variable):
        return ours(tape, variable)

    tape_module.watch_variable = foreign_watch_variable
    try:
        with pytest.raises(tfdtape.PatchConflictError) as raised:
            tfdtape.uninstall()
        assert tfdtape.is_installed()
        assert tape_module.watch_variable is foreign_watch_variable
        assert "tfdtape" in tape_module.variable_accessed.__module__
    finally:
        tape_module.watch_variable = ours
    assert str(raised.value) == (
        "tfdtape: cannot uninstall: another patch replaced tfdtape's "
        "(tensorflow.python.eager.tape.watch_variable): expected tfdtape's "
        "replacement, found test_lifecycle.test_uninstall_refuses_to_clobber_"
        "a_foreign_patch.<locals>.foreign_watch_variable in TensorFlow "
        f"{tf.__version__}. Remove the other patch first (restore tfdtape's "
        "function), then call tfdtape.uninstall() again.")


def test_missing_function_is_refused_before_anything_is_patched(
        uninstalled, monkeypatch):
    monkeypatch.delattr(tape_module, "variable_accessed")
    with pytest.raises(tfdtape.UnsupportedTensorFlowError) as raised:
        tfdtape.install()
    assert not tfdtape.is_installed()
    assert tape_module.watch_variable is uninstalled["watch_variable"]
    text = str(raised.value)
    assert text.startswith("tfdtape: a function tfdtape patches is missing "
                           "(tensorflow.python.eager.tape.variable_accessed)")
    assert f"in TensorFlow {tf.__version__}" in text
    assert "Install a TensorFlow release that tfdtape supports" in text
    assert isinstance(raised.value, RuntimeError)


def tensorflow_function(source, module):
    """The function `source` defines, compiled as if `module` defined it."""
    namespace = {}
    exec(compile(source, module.__file__, "exec"), vars(module), namespace)
    (function,) = namespace.values()
    return function


def test_function_of_another_shape_is_refused(uninstalled, monkeypatch):
    changed = tensorflow_function("def watch_variable(variable):\n    pass\n",
                                  tape_module)
    monkeypatch.setattr(tape_module, "watch_variable", changed)
    with pytest.raises(tfdtape.UnsupportedTensorFlowError,
                       match=r"unexpected shape \(tensorflow\.python\.eager\."
                             r"tape\.watch_variable\): expected \(tape, "
                             r"variable\), found \(variable\)"):
        tfdtape.install()
    assert not tfdtape.is_installed()
    assert tape_module.variable_accessed is uninstalled["variable_accessed"]


def test_another_librarys_function_is_a_conflict_not_an_unsupported_tensorflow(
        uninstalled, monkeypatch):
    monkeypatch.setattr(tape_module, "watch_variable", lambda variable: None)
    with pytest.raises(tfdtape.PatchConflictError) as raised:
        tfdtape.install()
    assert str(raised.value).startswith(
        "tfdtape: cannot install: another patch holds a function tfdtape "
        "replaces (tensorflow.python.eager.tape.watch_variable): expected "
        "TensorFlow's own function, found test_lifecycle.test_another_librarys_"
        "function_is_a_conflict_not_an_unsupported_tensorflow.<locals>.<lambda> "
        f"in TensorFlow {tf.__version__}.")
    assert not tfdtape.is_installed()
    assert tape_module.variable_accessed is uninstalled["variable_accessed"]


def test_the_testing_stand_ins_count_as_tensorflows_functions(monkeypatch):
    """TensorFlow 2.12's way of switching native resolution off, here on any
    TensorFlow: tfdtape.testing puts resolver-free tape functions in place,
    and tfdtape installs over them and puts them back."""
    from tfdtape import compat
    from tfdtape import testing
    monkeypatch.setattr(compat, "HAS_RESOLVER_REGISTRY", False)
    stand_in = testing._variable_accessed_unresolved
    with testing.tfdtape_alone():
        assert tfdtape.is_installed()
        assert targets.original_of(tape_module.variable_accessed) is stand_in
        with testing.pre_seed():
            assert tape_module.variable_accessed is stand_in
        assert targets.original_of(tape_module.variable_accessed) is stand_in
    assert tfdtape.is_installed()
    assert "/tensorflow/python/eager/" in targets.original_of(
        tape_module.variable_accessed).__code__.co_filename


def test_missing_internal_is_refused(uninstalled, monkeypatch):
    from tfdtape import compat
    monkeypatch.delattr(compat.strategy_context, "get_strategy_and_replica_context")
    with pytest.raises(tfdtape.UnsupportedTensorFlowError,
                       match=r"\.(distribute_lib|distribution_strategy_context)\."
                             r"get_strategy_and_replica_context"):
        tfdtape.install()
    assert not tfdtape.is_installed()


def test_missing_optional_bulk_function_is_skipped(uninstalled, monkeypatch):
    monkeypatch.delattr(tape_module, "variables_accessed")
    assert tfdtape.install() is True
    assert "variables_accessed" not in vars(tape_module)
    assert tfdtape.uninstall() is True


def test_a_failing_replacement_rolls_back(uninstalled, monkeypatch):
    class Refusing(type):
        def __setattr__(cls, name, value):
            raise AttributeError(f"{cls.__name__} is read-only")

    class Frozen(metaclass=Refusing):
        def method(self):
            return "original"

    real_targets = targets.patch_targets
    monkeypatch.setattr(targets, "patch_targets", lambda: real_targets() + [
        targets.PatchTarget(Frozen, "method", ("self",),
                            lambda original: lambda self: "replaced")])
    with pytest.raises(AttributeError, match="Frozen is read-only"):
        tfdtape.install()
    assert not tfdtape.is_installed()
    restored = current_functions()
    for name, original in uninstalled.items():
        assert restored[name] is original, name


def test_install_logs_what_it_patched_once(uninstalled, caplog):
    with caplog.at_level(logging.INFO, logger="tfdtape"):
        tfdtape.install()
        tfdtape.install()
    lines = [r.getMessage() for r in caplog.records if "tfdtape" in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].startswith(f"tfdtape: installed into TensorFlow {tf.__version__}")
    assert "tensorflow.python.eager.tape.variable_accessed" in lines[0]
    assert "tensorflow.python.eager.backprop.GradientTape.gradient" in lines[0]


def test_installing_adds_no_logging_handler():
    code, out, err = run_python(
        "import logging\nimport tfdtape\nassert tfdtape.is_installed()\n"
        "print(logging.getLogger().handlers, logging.getLogger('tfdtape').handlers)")
    assert code == 0, err
    assert out == "[] []"


def run_python(code, **environment):
    """Runs `code` in a fresh interpreter; returns (exit code, stdout, stderr)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **environment)
    completed = subprocess.run([sys.executable, "-c", code], env=env,
                               capture_output=True, text=True, timeout=300)
    return completed.returncode, completed.stdout.strip(), completed.stderr


CONTAINER_CHECK = """
import tfdtape, tensorflow as tf
from tfdtape import resolution
strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
with strategy.scope():
    v = tf.Variable(1.0)
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(v)
print(tfdtape.is_installed(), resolution.watched_by(tape)[0] is v.values[0])
"""


@pytest.mark.parametrize("order", ["tfdtape first", "tensorflow first"])
def test_import_installs_in_either_order(order):
    imports = ("import tfdtape\nimport tensorflow\n" if order == "tfdtape first"
               else "import tensorflow\nimport tfdtape\n")
    code, out, err = run_python(imports + CONTAINER_CHECK)
    assert code == 0, err
    assert out.splitlines()[-1] == "True True"


def test_autoinstall_can_be_switched_off():
    code, out, err = run_python(
        "import tfdtape\nprint(tfdtape.is_installed())", TFDTAPE_AUTOINSTALL="0")
    assert code == 0, err
    assert out == "False"


def test_unreadable_autoinstall_value_is_an_error():
    code, _, err = run_python("import tfdtape", TFDTAPE_AUTOINSTALL="maybe")
    assert code == 1
    assert ("ValueError: tfdtape: TFDTAPE_AUTOINSTALL='maybe' is not understood: "
            "expected one of 0, 1, false, no, off, on, true, yes.") in err


def test_missing_strategy_stack_is_refused(uninstalled, monkeypatch):
    from tensorflow.python.framework import ops
    monkeypatch.delattr(ops.Graph, "_distribution_strategy_stack")
    with pytest.raises(tfdtape.UnsupportedTensorFlowError,
                       match=r"\(Graph\._distribution_strategy_stack\)"):
        tfdtape.install()
    assert not tfdtape.is_installed()


def test_tensorflow_treats_tfdtape_as_library_code_while_installed(uninstalled):
    """AutoGraph leaves tfdtape's functions unconverted, and TensorFlow's
    frame filters leave its frames out; uninstall() puts back TensorFlow's
    own lists."""
    from tensorflow.python.autograph.core import config
    from tensorflow.python.autograph.impl import conversion
    from tensorflow.python.util import tf_stack
    from tensorflow.python.util import traceback_utils

    from tfdtape import gradient_tape

    def lists():
        return (traceback_utils._EXCLUDED_PATHS,
                tf_stack._source_filter_stacks.default_factory,
                config.CONVERSION_RULES)

    tensorflows = lists()
    assert not conversion.is_allowlisted(gradient_tape._watchables)
    tfdtape.install()
    assert conversion.is_allowlisted(gradient_tape._watchables)
    excluded, factory, rules = lists()
    assert excluded[:-1] == tensorflows[0]
    assert excluded[-1].endswith(f"{os.sep}tfdtape{os.sep}")
    assert rules[1:] == tensorflows[2]
    (bottom,) = factory()
    assert gradient_tape.__file__ in bottom.get_filtered_filenames()
    tfdtape.uninstall()
    assert all(now is then for now, then in zip(lists(), tensorflows))
    assert not conversion.is_allowlisted(gradient_tape._watchables)
