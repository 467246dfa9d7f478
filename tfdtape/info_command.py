"""`python -m tfdtape info`: versions, TensorFlow's own resolution, and who
holds each patch target now."""

import platform

from tfdtape import command_line


def run(args):
    """Prints the report; returns the exit status."""
    del args
    tf = command_line.import_tensorflow()
    from tfdtape import compat  # pylint: disable=g-import-not-at-top
    from tfdtape import defun  # pylint: disable=g-import-not-at-top
    from tfdtape import errors  # pylint: disable=g-import-not-at-top
    from tfdtape import patching  # pylint: disable=g-import-not-at-top
    from tfdtape import targets  # pylint: disable=g-import-not-at-top
    from tfdtape import testing  # pylint: disable=g-import-not-at-top
    from tfdtape import versions  # pylint: disable=g-import-not-at-top
    print(f"tfdtape {versions.RELEASE} (supports TensorFlow "
          f"{versions.TENSORFLOW_REQUIREMENT})")
    print(f"TensorFlow {tf.__version__}, Python {platform.python_version()}")
    print(f"TensorFlow's native resolver: "
          f"{testing.native_resolution_description()}"
          + (" (one-shot hook, no unregister)" if compat.HAS_RESOLVER_REGISTRY
             else ""))
    resolving = defun.classes_with_captured_input_resolution()
    print("defun captured-input resolution: " + (
        ", ".join(cls.__qualname__ for cls in resolving) if resolving
        else "absent (removed upstream, as the commit did)"))
    installed = patching.is_installed()
    print(f"installed in this process: {'yes' if installed else 'no'}"
          " (`import tfdtape` installs)")
    try:
        patching.preflight()
        print("install check: OK")
    except (errors.UnsupportedTensorFlowError, errors.PatchConflictError) as error:
        print(f"install check: FAILED: {error}")
    print("patch targets (who holds each now, judged by identity):")
    for target in targets.patch_targets():
        print(f"  {target.symbol}: {_holder_text(target, targets)}")
    return command_line.EXIT_PASSED


def _holder_text(target, targets):
    holder = target.holder()
    if holder == targets.TFDTAPE:
        return "tfdtape's replacement"
    if holder == targets.TENSORFLOW:
        return "TensorFlow's original"
    if holder == targets.MISSING:
        return "missing"
    return f"another library's patch ({targets.describe(target.current())})"
