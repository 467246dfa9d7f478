"""tfdtape beside other code: patched() across threads, other libraries'
patches on the same functions, and a block's own exceptions.

Each test runs in three configurations: stock TensorFlow (tfdtape not
installed), tfdtape_alone (TensorFlow's resolver off, tfdtape installed) and
pre_seed (both off). The fourth, tfdtape as users run it, is the session's
default state that every other test module runs in.
"""

import contextlib
import functools
import threading

import pytest
import tensorflow as tf
import wrapt
from tensorflow.python.eager import tape as tape_module

import tfdtape
from tfdtape import targets
from tfdtape import testing

pytestmark = pytest.mark.per_release

CONFIGURATIONS = ("stock", "tfdtape_alone", "pre_seed")
THREADS = 8
ROUNDS = 25
VARIABLE_ACCESSED = "tensorflow.python.eager.tape.variable_accessed"
WRAPPER_SHAPES = ("same parameters", "*args, **kwargs", "functools.wraps",
                  "wrapt.FunctionWrapper")


@pytest.fixture(params=CONFIGURATIONS)
def configuration(request):
    """Runs the test in each of the three configurations; yields its name."""
    with testing.configuration(request.param):
        yield request.param


def holders():
    """{symbol: object} for every patch target, as TensorFlow holds them now."""
    return {target.symbol: target.current() for target in targets.patch_targets()}


def without_tfdtape():
    """{symbol: object} TensorFlow would hold with tfdtape uninstalled."""
    return {symbol: targets.original_of(current) or current
            for symbol, current in holders().items()}


def assert_holds(expected):
    """Asserts TensorFlow holds exactly the objects of `expected`."""
    found = holders()
    assert found.keys() == expected.keys()
    for symbol, function in expected.items():
        assert found[symbol] is function, symbol


def counting_wrapper(shape, wrapped, calls):
    """Another library's wrapper around `wrapped` (a variable_accessed) of
    the given shape; each call appends the variable to `calls`."""
    if shape == "same parameters":
        def variable_accessed(variable):
            calls.append(variable)
            return wrapped(variable)
        return variable_accessed
    if shape == "*args, **kwargs":
        def forwarding(*args, **kwargs):
            calls.append(args[0])
            return wrapped(*args, **kwargs)
        return forwarding
    if shape == "functools.wraps":
        @functools.wraps(wrapped)
        def decorated(*args, **kwargs):
            calls.append(args[0])
            return wrapped(*args, **kwargs)
        return decorated

    def wrapt_wrapper(function, instance, args, kwargs):
        del instance
        calls.append(args[0])
        return function(*args, **kwargs)
    return wrapt.FunctionWrapper(wrapped, wrapt_wrapper)


WRAPPER_NAMES = {
    "same parameters":
        "test_coexistence.counting_wrapper.<locals>.variable_accessed",
    "*args, **kwargs": "test_coexistence.counting_wrapper.<locals>.forwarding",
    "functools.wraps": "test_coexistence.counting_wrapper.<locals>.decorated",
    "wrapt.FunctionWrapper": f"a {type(wrapt.FunctionWrapper(print, print)).__module__}"
                             ".FunctionWrapper object",
}


def put(function):
    """Makes `function` TensorFlow's tape.variable_accessed."""
    tape_module.variable_accessed = function


def replica_reads(strategy, variable):
    """Runs one read of `variable` per replica in a tape; returns, per
    replica, whether the tape watched the container `variable`."""
    seen = []

    def step():
        with tf.GradientTape() as tape:
            tf.identity(variable)
        watched = tape.watched_variables()
        seen.append(len(watched) == 1 and watched[0] is variable)
    strategy.run(step)
    return seen


# 1. patched() blocks nest and overlap across threads.

def test_blocks_nest_and_the_last_restores_the_state_before_the_first(
        configuration):
    before = holders()
    installed_before = tfdtape.is_installed()
    with tfdtape.patched():
        installed = holders()
        with tfdtape.patched():
            assert tfdtape.is_installed()
            assert tfdtape.install() is False
            with pytest.raises(tfdtape.PatchInUseError) as raised:
                tfdtape.uninstall()
            assert_holds(installed)
        assert_holds(installed)
    assert_holds(before)
    assert tfdtape.is_installed() is installed_before
    assert str(raised.value) == (
        "tfdtape: cannot uninstall while tfdtape.patched() blocks are open "
        "(tfdtape.uninstall): expected no open tfdtape.patched() block, found 2 "
        f"open in TensorFlow {tf.__version__}. Call tfdtape.uninstall() after "
        "the blocks close, or leave it to them: the last block to close "
        "restores the state from before the first.")
    assert isinstance(raised.value, RuntimeError)


def test_a_block_closing_in_another_thread_leaves_tfdtape_installed(
        configuration):
    """The issue's failure, made deterministic: the thread that opened the
    first block closes it while this thread's block is still open."""
    before = holders()
    opened, close = threading.Event(), threading.Event()

    def first_block():
        with tfdtape.patched():
            opened.set()
            close.wait(timeout=30)

    other = threading.Thread(target=first_block)
    other.start()
    assert opened.wait(timeout=30)
    with tfdtape.patched():
        close.set()
        other.join(timeout=30)
        assert not other.is_alive()
        assert tfdtape.is_installed()
    assert_holds(before)


def test_a_block_that_cannot_install_opens_nothing(configuration):
    """install() refusing on entry leaves no block open behind."""
    was_installed = tfdtape.uninstall()
    original = tape_module.variable_accessed
    put(counting_wrapper("same parameters", original, []))
    try:
        with pytest.raises(tfdtape.PatchConflictError):
            with tfdtape.patched():
                pytest.fail("the block ran without tfdtape")
    finally:
        put(original)
    assert tfdtape.uninstall() is False  # not PatchInUseError: no block open
    if was_installed:
        tfdtape.install()


def test_threads_mixing_blocks_and_gradients(configuration, strategy):
    """8 threads; the even ones open a block around strategy.run, every
    replica function opens its own block inside. Every block must see tfdtape
    installed from start to end, and its tapes watch the MirroredVariable."""
    with strategy.scope():
        variable = tf.Variable(3.0)
    before, tensorflow = holders(), without_tfdtape()
    installed_before = tfdtape.is_installed()
    blocks = []       # one (kind, saw tfdtape installed throughout) per block
    replica_tapes = []  # per replica step: (watched the container, gradient)
    failures = []

    def step():
        with tfdtape.patched():
            installed_at_start = tfdtape.is_installed()
            with tf.GradientTape() as tape:
                loss = variable * variable
            watched = tape.watched_variables()
            gradient = tape.gradient(loss, variable)
            blocks.append(("replica", installed_at_start and tfdtape.is_installed()))
        replica_tapes.append((len(watched) == 1 and watched[0] is variable,
                              float(gradient)))
        return gradient

    def worker(index):
        try:
            for _ in range(ROUNDS):
                if index % 2:
                    strategy.run(step)
                    continue
                with tfdtape.patched():
                    installed_at_start = tfdtape.is_installed()
                    strategy.run(step)
                    blocks.append(("outer", installed_at_start and tfdtape.is_installed()))
        except Exception as error:
            failures.append(error)  # reported below, not swallowed

    threads = [threading.Thread(target=worker, args=(index,))
               for index in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert failures == []
    assert not any(thread.is_alive() for thread in threads)

    saw_installed = sum(installed for _, installed in blocks)
    container_tapes = sum(watched for watched, _ in replica_tapes)
    figures = (f"{configuration}: {len(blocks)} blocks run "
               f"({sum(kind == 'outer' for kind, _ in blocks)} around "
               f"strategy.run, {sum(kind == 'replica' for kind, _ in blocks)} in "
               f"replica functions), {saw_installed} saw tfdtape installed "
               f"throughout; {container_tapes} of {len(replica_tapes)} replica "
               "tapes watched the MirroredVariable")
    print(figures)
    replica_blocks = THREADS * ROUNDS * strategy.num_replicas_in_sync
    assert len(blocks) == replica_blocks + THREADS // 2 * ROUNDS, figures
    assert saw_installed == len(blocks), figures
    assert container_tapes == len(replica_tapes) == replica_blocks, figures
    assert {gradient for _, gradient in replica_tapes} == {6.0}
    assert_holds(before)
    assert tfdtape.uninstall() is installed_before  # no block left open
    assert_holds(tensorflow)  # TensorFlow's exact originals
    if installed_before:
        tfdtape.install()


# 2. Other libraries' patches on the functions tfdtape replaces.

@pytest.mark.parametrize("shape", WRAPPER_SHAPES)
def test_a_patch_installed_before_tfdtape_is_refused_by_name(configuration, shape):
    was_installed = tfdtape.uninstall()
    before = holders()
    calls = []
    wrapper = counting_wrapper(shape, before[VARIABLE_ACCESSED], calls)
    put(wrapper)
    try:
        with pytest.raises(tfdtape.PatchConflictError) as raised:
            tfdtape.install()
        assert_holds({**before, VARIABLE_ACCESSED: wrapper})  # nothing patched
        variable = tf.Variable(1.0)
        with tf.GradientTape():
            variable.read_value()
        assert len(calls) == 1 and calls[0] is variable  # not bypassed
    finally:
        put(before[VARIABLE_ACCESSED])
    assert str(raised.value) == (
        "tfdtape: cannot install: another patch holds a function tfdtape "
        f"replaces ({VARIABLE_ACCESSED}): expected TensorFlow's own function, "
        f"found {WRAPPER_NAMES[shape]} in TensorFlow {tf.__version__}. tfdtape "
        "cannot tell what that patch does with the variable, and would stop "
        "calling it. Import tfdtape before the library that installed it (its "
        "wrapper then wraps tfdtape's function and both run, that wrapper "
        "first), or remove that patch.")
    assert_holds(before)
    if was_installed:
        tfdtape.install()


@pytest.mark.parametrize("removal", ["other patch removed first",
                                     "tfdtape uninstalled first"])
@pytest.mark.parametrize("shape", WRAPPER_SHAPES)
def test_a_patch_installed_after_tfdtape_wraps_it(configuration, strategy,
                                                  shape, removal):
    """Both run, the other wrapper outermost and once per call; tfdtape only
    uninstalls once TensorFlow holds tfdtape's function again."""
    with strategy.scope():
        variable = tf.Variable(1.0)
    was_installed = tfdtape.install() is False
    tensorflow = without_tfdtape()
    ours = tape_module.variable_accessed
    calls = []
    wrapper = counting_wrapper(shape, ours, calls)
    put(wrapper)
    try:
        assert tfdtape.is_installed()
        with tfdtape.trace() as trace:
            watched_container = replica_reads(strategy, variable)
        assert watched_container == [True] * strategy.num_replicas_in_sync
        accesses = [event.variable for event in trace.events]
        assert len(calls) == len(accesses) == strategy.num_replicas_in_sync
        assert all(seen is handed for seen, handed in zip(calls, accesses))
        if removal == "tfdtape uninstalled first":
            with pytest.raises(tfdtape.PatchConflictError) as raised:
                tfdtape.uninstall()
            assert str(raised.value) == (
                "tfdtape: cannot uninstall: another patch replaced tfdtape's "
                f"({VARIABLE_ACCESSED}): expected tfdtape's replacement, found "
                f"{WRAPPER_NAMES[shape]} in TensorFlow {tf.__version__}. Remove "
                "the other patch first (restore tfdtape's function), then call "
                "tfdtape.uninstall() again.")
            assert tape_module.variable_accessed is wrapper
            assert tfdtape.is_installed()
    finally:
        put(ours)
    assert tfdtape.uninstall() is True
    assert_holds(tensorflow)
    if was_installed:
        tfdtape.install()


# 3. A block's own exception wins over a conflict found on its exit.

class BlockError(Exception):
    """The exception the user's code raises inside patched()."""


def test_the_blocks_exception_propagates_with_the_conflict_as_a_note(
        configuration):
    error = BlockError("raised by the block")
    ours = []
    with pytest.raises(BlockError) as raised:
        with tfdtape.patched():
            ours.append(tape_module.variable_accessed)
            put(counting_wrapper("same parameters", ours[0], []))
            raise error
    restores = configuration != "tfdtape_alone"  # the block restores "uninstalled"
    try:
        assert raised.value is error
        assert error.args == ("raised by the block",)
        assert error.__cause__ is None and error.__context__ is None
        expected_notes = [
            "While leaving tfdtape.patched(): tfdtape: cannot uninstall: another "
            f"patch replaced tfdtape's ({VARIABLE_ACCESSED}): expected tfdtape's "
            "replacement, found test_coexistence.counting_wrapper.<locals>."
            f"variable_accessed in TensorFlow {tf.__version__}. Remove the other "
            "patch first (restore tfdtape's function), then call "
            "tfdtape.uninstall() again."]
        assert getattr(error, "__notes__", []) == (expected_notes if restores else [])
    finally:
        put(ours[0])
    # The block is closed all the same, leaving tfdtape installed: the wrapper
    # kept it from restoring anything.
    assert tfdtape.uninstall() is True
    if not restores:
        tfdtape.install()


def test_without_an_exception_the_conflict_is_raised(configuration):
    ours = []
    restores = configuration != "tfdtape_alone"
    try:
        with (pytest.raises(tfdtape.PatchConflictError, match="cannot uninstall")
              if restores else contextlib.nullcontext()):
            with tfdtape.patched():
                ours.append(tape_module.variable_accessed)
                put(counting_wrapper("same parameters", ours[0], []))
    finally:
        put(ours[0])
    # The block is closed all the same, leaving tfdtape installed: the wrapper
    # kept it from restoring anything.
    assert tfdtape.uninstall() is True
    if not restores:
        tfdtape.install()


def test_a_blocks_exception_without_a_conflict_has_no_note(configuration):
    before = holders()
    error = BlockError("raised by the block")
    with pytest.raises(BlockError) as raised:
        with tfdtape.patched():
            raise error
    assert raised.value is error
    assert not hasattr(error, "__notes__")
    assert_holds(before)
