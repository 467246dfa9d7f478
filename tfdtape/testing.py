"""Helpers for testing code under tfdtape: devices, strategies, configurations.

`virtual_cpus(n)` splits the CPU into n logical devices, which a process can
do only once, before TensorFlow's runtime starts. The context managers put
TensorFlow into the configurations tfdtape is tested in:

- `stock()`: TensorFlow as it ships (tfdtape uninstalled, native resolver on);
- `with_tfdtape()`: TensorFlow as users run it with tfdtape (both on);
- `tfdtape_alone()`: TensorFlow's native resolver off, tfdtape installed;
- `pre_seed()`: TensorFlow as before the commit (both off), the control.

Each restores the previous state when it exits.
"""

import contextlib

import tensorflow as tf
from tensorflow.python import pywrap_tfe
from tensorflow.python.eager import tape as tape_module

from tfdtape import compat
from tfdtape import errors
from tfdtape import patching
from tfdtape import process_state

CONFIGURATIONS = ("stock", "tfdtape", "tfdtape_alone", "pre_seed")
"""The names of the configurations, in report order."""

PATCHED_CONFIGURATIONS = ("tfdtape", "tfdtape_alone")
"""The configurations in which tfdtape is installed."""


def virtual_cpus(n):
    """Splits the host CPU into `n` logical devices; returns their names.

    Call it before TensorFlow's runtime starts (before any op runs). Called
    again with the same `n`, it returns the same names.

    Raises:
        ValueError: `n` is not a positive int.
        RuntimeError: the runtime already started with another CPU layout.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"tfdtape.testing.virtual_cpus: expected a positive "
                         f"int, found {n!r}")
    physical = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            physical, [tf.config.LogicalDeviceConfiguration()] * n)
    except RuntimeError:
        pass  # The runtime has started; the layout check below decides.
    logical = [device.name for device in tf.config.list_logical_devices("CPU")]
    if len(logical) != n:
        raise RuntimeError(errors.message(
            f"cannot split the CPU into {n} logical devices",
            "tf.config.set_logical_device_configuration",
            f"{n} logical CPUs", f"{len(logical)} already configured",
            "TensorFlow's runtime has started; call virtual_cpus() before any "
            "TensorFlow op runs, or run this layout in a fresh process"))
    return logical


def mirrored_strategy(n):
    """A `tf.distribute.MirroredStrategy` over `n` virtual CPUs."""
    return tf.distribute.MirroredStrategy(virtual_cpus(n))


def _watch_variable_unresolved(tape, variable):
    """tape.watch_variable as before the commit: the variable as handed over."""
    pywrap_tfe.TFE_Py_TapeWatchVariable(tape._tape, variable)
    pywrap_tfe.TFE_Py_VariableWatcherVariableAccessed(variable)


def _variable_accessed_unresolved(variable):
    """tape.variable_accessed as before the commit."""
    pywrap_tfe.TFE_Py_TapeVariableAccessed(variable)
    pywrap_tfe.TFE_Py_VariableWatcherVariableAccessed(variable)


def _variables_accessed_unresolved(variables):
    """tape.variables_accessed as before the commit."""
    for variable in variables:
        if variable.trainable:
            _variable_accessed_unresolved(variable)


# TensorFlow 2.12 resolves inline in these functions; switching its native
# resolution off means replacing them with these resolver-free versions, and
# counting how many blocks have it off.
# Kept across importlib.reload, which would otherwise forget open blocks.
_inline_resolution_switched_off = process_state.kept(
    globals(), "_inline_resolution_switched_off", int)
_UNRESOLVED_FUNCTIONS = {
    "watch_variable": _watch_variable_unresolved,
    "variable_accessed": _variable_accessed_unresolved,
    "variables_accessed": _variables_accessed_unresolved,
}


def native_resolver_is_registered():
    """True when TensorFlow's own watched-variable resolution is switched on.

    From 2.13 that is the resolver registered with
    `tape.register_watched_variable_resolver`; in 2.12, the resolution
    written inside TensorFlow's tape functions.
    """
    if compat.HAS_RESOLVER_REGISTRY:
        return (tape_module._variables_override
                is not tape_module.default_get_variables)
    # 2.12: tfdtape may sit on top of the resolver-free functions, so the
    # module attributes cannot tell; _native_resolver keeps count.
    return _inline_resolution_switched_off == 0


def native_resolution_description():
    """How TensorFlow's own resolution is present now, in words."""
    if not native_resolver_is_registered():
        return "switched off"
    if compat.HAS_RESOLVER_REGISTRY:
        return "registered (tape.register_watched_variable_resolver)"
    return "inline in TensorFlow's tape functions (TensorFlow 2.12)"


@contextlib.contextmanager
def _native_resolver(enabled):
    """Switches TensorFlow's native resolution on or off inside the block.

    Switching it off in TensorFlow 2.12 replaces the tape functions, so
    tfdtape must be uninstalled then. Switching it on inside a block that
    switched it off puts the state from before that block back for the
    inner block.
    """
    if enabled and native_resolver_is_registered():
        yield
    elif enabled:
        # Switched off by an enclosing block: put its saved state back
        # for this block.
        if not _switched_off_states:
            raise RuntimeError("tfdtape.testing: TensorFlow's native resolver "
                               "was switched off outside tfdtape.testing; "
                               "cannot restore stock TensorFlow")
        state = _resolution_state()
        _set_resolution_state(_switched_off_states[0], -1)
        try:
            yield
        finally:
            _set_resolution_state(state, 1)
    else:
        state = _resolution_state()
        _switched_off_states.append(state)
        _set_resolution_state(_resolution_off(), 1)
        try:
            yield
        finally:
            _switched_off_states.pop()
            _set_resolution_state(state, -1)


# The states that blocks switching the resolver off saved, outermost first.
_switched_off_states = process_state.kept(globals(), "_switched_off_states", list)


def _resolution_off():
    """The state of TensorFlow's resolution switched off."""
    if compat.HAS_RESOLVER_REGISTRY:
        return tape_module.default_get_variables
    return _UNRESOLVED_FUNCTIONS


def _resolution_state():
    """What TensorFlow's resolution is now: the registered resolver (2.13+),
    or the tape functions (2.12)."""
    if compat.HAS_RESOLVER_REGISTRY:
        return tape_module._variables_override
    return {name: vars(tape_module)[name] for name in _UNRESOLVED_FUNCTIONS}


def _set_resolution_state(state, switched_off_change):
    """Puts `state` (as `_resolution_state` gives it) in place; in 2.12 also
    counts the blocks that have it off."""
    global _inline_resolution_switched_off
    if compat.HAS_RESOLVER_REGISTRY:
        tape_module._variables_override = state
        return
    for name, function in state.items():
        setattr(tape_module, name, function)
    _inline_resolution_switched_off += switched_off_change


@contextlib.contextmanager
def _tfdtape(enabled):
    """Installs (enabled=True) or uninstalls tfdtape inside the block."""
    was_installed = patching.is_installed()
    if enabled:
        patching.install()
    else:
        patching.uninstall()
    try:
        yield
    finally:
        if was_installed and not patching.is_installed():
            patching.install()
        elif not was_installed and patching.is_installed():
            patching.uninstall()


@contextlib.contextmanager
def stock():
    """TensorFlow as it ships: tfdtape uninstalled, native resolver on."""
    with _tfdtape(False), _native_resolver(True):
        yield


@contextlib.contextmanager
def with_tfdtape():
    """TensorFlow as users run it with tfdtape: both tfdtape and the native
    resolver on."""
    with _native_resolver(True), _tfdtape(True):
        yield


@contextlib.contextmanager
def tfdtape_alone():
    """TensorFlow's native resolver off and tfdtape installed."""
    with _tfdtape(False), _native_resolver(False), _tfdtape(True):
        yield


@contextlib.contextmanager
def pre_seed():
    """TensorFlow as before the commit: native resolver off, tfdtape uninstalled."""
    with _tfdtape(False), _native_resolver(False):
        yield


def configuration(name):
    """The context manager for the configuration called `name`."""
    managers = {"stock": stock, "tfdtape": with_tfdtape,
                "tfdtape_alone": tfdtape_alone, "pre_seed": pre_seed}
    if name not in managers:
        raise ValueError(f"tfdtape.testing.configuration: expected one of "
                         f"{', '.join(CONFIGURATIONS)}, found {name!r}")
    return managers[name]()
