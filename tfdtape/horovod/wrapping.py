"""Horovod's way of wrapping a user's object (a tape, an optimizer): an
instance of a subclass of the object's own class, sharing its state, with
some methods replaced."""

_subclasses = {}  # (class, names of the replaced methods) -> subclass


def _subclass(instance, methods):
    """The subclass of `instance`'s class (of its wrapped class, when it is
    one of these already) with `methods` ({name: function or property}) in
    place; it keeps the class's name, module and doc (so that Keras saves
    it as the class it wraps), and is made once per class."""
    base = type(instance)
    if base in _subclasses.values():
        base = base.__mro__[1]
    key = (base, tuple(sorted(methods)))
    subclass = _subclasses.get(key)
    if subclass is None:
        subclass = type(base.__name__, (base,), dict(
            methods, __doc__=base.__doc__, __module__=base.__module__,
            __qualname__=base.__qualname__))
        _subclasses[key] = subclass
    return subclass


def rewrapped(instance, methods):
    """A copy of `instance` (sharing its attributes' values) whose class is
    its class's subclass with `methods` in place."""
    subclass = _subclass(instance, methods)
    wrapped = subclass.__new__(subclass)
    wrapped.__dict__.update(instance.__dict__)
    return wrapped


def convert(instance, methods):
    """Gives `instance` itself, in place, its class's subclass with
    `methods` in place."""
    instance.__class__ = _subclass(instance, methods)
