"""The examples in the docstrings of operators/, config/ and pipeline/ run and hold.

Every module of the three packages is imported and its docstrings searched for ``>>>``
examples, so an example added anywhere runs here without registering it.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

PACKAGES = ("dpstream.operators", "dpstream.config", "dpstream.pipeline", "dpstream.deploy")


def module_names() -> list[str]:
    names = []
    for package in PACKAGES:
        path = importlib.import_module(package).__path__
        names.append(package)
        names += [m.name for m in pkgutil.walk_packages(path, package + ".")]
    return sorted(names)


def examples(name: str) -> list[doctest.DocTest]:
    module = importlib.import_module(name)
    found = doctest.DocTestFinder(exclude_empty=True).find(module, name)
    # Only the module's own docstrings: not those of names it imports.
    return [t for t in found if t.examples and t.name.startswith(name)]


@pytest.mark.parametrize("name", [n for n in module_names() if examples(n)])
def test_docstring_examples(name):
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    for test in examples(name):
        runner.run(test, out=report.append)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, "".join(report)


def test_the_examples_are_there():
    """A handful of helpers carry examples; losing them all would pass the test above."""
    total = sum(len(t.examples) for n in module_names() for t in examples(n))
    assert total >= 10
