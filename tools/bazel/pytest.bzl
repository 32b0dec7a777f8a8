"""One Bazel py_test per pytest file, run by tools/bazel/pytest_runner.py.

    load("//tools/bazel:pytest.bzl", "pytest_tests")
    pytest_tests(srcs = glob(["**/*_test.py"]), deps = [...])

creates `//tests:<path without .py>` for each file, e.g. `//tests:data/partition_test`
for tests/data/partition_test.py, so new test files are picked up automatically.
"""

_RUNNER = "//tools/bazel:pytest_runner.py"

def pytest_test(name, src, deps = [], data = [], args = [], tags = [], size = "medium", timeout = "long", **kwargs):
    """A py_test running the single pytest file `src` (extra pytest args: `args` or --test_arg)."""
    native.py_test(
        name = name,
        srcs = [_RUNNER, src],
        main = _RUNNER,
        args = ["$(rootpath %s)" % src] + args,
        python_version = "PY3",
        srcs_version = "PY3",
        deps = deps,
        data = data,
        tags = tags,
        size = size,
        timeout = timeout,
        **kwargs
    )

def pytest_tests(
        srcs,
        deps = [],
        data = [],
        tags = [],
        heavy_dirs = [],
        ci = [],
        overrides = {},
        **kwargs):
    """One pytest_test per file in `srcs`.

    Args:
      srcs: the pytest files (a glob of **/*_test.py).
      deps, data, tags: given to every test.
      heavy_dirs: directory prefixes (e.g. "algorithms/") whose tests are
        size "large" and tagged "heavy"; the others are size "medium". All have
        timeout "long" (900 s, like pytest-timeout in pyproject.toml).
      ci: files (relative to the package) that CI runs under Bazel: tagged "bazel_ci".
        A name that matches no file in `srcs` is an error, so a renamed file cannot
        silently drop out of CI.
      overrides: {file: {attr: value}} per-file attributes (size, timeout, tags, ...;
        "data" adds to `data`),
        e.g. {"runtime/remote_test.py": {"flaky": True}}.
      **kwargs: passed to every py_test (e.g. local = True).
    """
    for f in ci:
        if f not in srcs:
            fail("pytest_tests: ci file '%s' is not among the test files of //%s" % (f, native.package_name()))
    for f in overrides:
        if f not in srcs:
            fail("pytest_tests: override for '%s', which is not a test file of //%s" % (f, native.package_name()))

    for src in srcs:
        if not src.endswith(".py"):
            fail("pytest_tests: %s is not a .py file" % src)
        name = src[:-len(".py")]
        subdir = src.rpartition("/")[0]
        heavy = False
        for d in heavy_dirs:
            if src.startswith(d.rstrip("/") + "/"):
                heavy = True
        attrs = dict(kwargs)
        attrs["size"] = "large" if heavy else "medium"
        t = list(tags)
        if subdir:
            # `bazel test //tests/... --test_tag_filters=models` runs tests/models/**.
            t.append(subdir.partition("/")[0])
        if heavy:
            t.append("heavy")
        if src in ci:
            t.append("bazel_ci")
        o = dict(overrides.get(src, {}))
        t += o.pop("tags", [])
        test_data = data + o.pop("data", [])
        attrs.update(o)
        pytest_test(
            name = name,
            src = src,
            deps = deps,
            data = test_data,
            tags = t,
            **attrs
        )
