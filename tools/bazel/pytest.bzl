"""pytest_test: one py_test target running one pytest module of tests/."""

def pytest_test(name, size = "medium", tags = [], deps = [], pytest_args = []):
    """A py_test that runs tests/<name>.py under pytest.

    Args:
      name: the test module's name, without .py.
      size: Bazel's test size (sets the timeout).
      tags: Bazel tags.
      deps: extra dependencies besides //:tfdtape.
      pytest_args: extra pytest arguments, e.g. a marker expression.
    """
    native.py_test(
        name = name,
        size = size,
        srcs = ["tests/run_pytest.py", "tests/%s.py" % name],
        main = "tests/run_pytest.py",
        args = ["tests/%s.py" % name] + pytest_args,
        data = [":test_support"],
        deps = ["//:tfdtape"] + deps,
        python_version = "PY3",
        tags = tags,
    )
