"""Every package of the source tree is in the distribution (a non-editable install, e.g.
the worker image, gets only the packages pyproject.toml lists).

``dpstream.statistics`` (the folder ``statistics/``) has no ``__init__.py`` on purpose: a
regular package of that name at the repository root would shadow the standard library's
``statistics`` wherever the root is on ``sys.path`` (pytest, ``python -m`` from a checkout),
and Faust imports it. A namespace package never shadows a module."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_lists_every_package():
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setup["packages"])
    found = set()
    for package, folder in setup["package-dir"].items():
        if any((ROOT / folder).glob("*.py")):  # the package itself, regular or namespace
            found.add(package)
        if package in setup["package-data"]:  # data files only (docs/schemas/)
            found.add(package)
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((package, *parts)))
    assert listed == found
