"""pytest_test: one py_test target running one pytest module of tests/."""

def pytest_test(name, size = "medium", timeout = None, tags = [], deps = [], pytest_args = []):
    """A py_test that runs tests/<name>.py under pytest.

    Args:
      name: the test module's name, without .py.
      size: Bazel's test size (sets the timeout unless `timeout` does).
      timeout: Bazel's test timeout ("short", "moderate", "long",
        "eternal"), for targets whose run time says more than their size.
      tags: Bazel tags.
      deps: extra dependencies besides //:tfdtape.
      pytest_args: extra pytest arguments, e.g. a marker expression.
    """
    native.py_test(
        name = name,
        size = size,
        timeout = timeout,
        srcs = ["tests/run_pytest.py", "tests/%s.py" % name],
        main = "tests/run_pytest.py",
        args = ["tests/%s.py" % name] + pytest_args,
        data = [":test_support"],
        deps = ["//:tfdtape"] + deps,
        python_version = "PY3",
        tags = tags,
    )
