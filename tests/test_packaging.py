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


def test_the_package_data_patterns_cover_every_data_file():
    # The wheel ships the data files package-data lists: the published schemas
    # (docs/schemas/, read by dpstream.client) and the dashboard's page (pipeline/tools/
    # static/), which a pattern that missed a file would leave out of every install.
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert {"dpstream.schemas", "dpstream.pipeline.tools"} <= set(setup["package-data"])
    for package, patterns in setup["package-data"].items():
        folder = ROOT / setup["package-dir"].get(package, "")
        if package not in setup["package-dir"]:  # a sub-package of a mapped one
            parent, _, rest = package.rpartition(".")
            while parent not in setup["package-dir"]:
                parent, _, more = parent.rpartition(".")
                rest = f"{more}/{rest}"
            folder = ROOT / setup["package-dir"][parent] / rest.replace(".", "/")
        shipped = {p for pattern in patterns for p in folder.glob(pattern)}
        files = {p for p in folder.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")}
        assert files, package
        assert files <= shipped, (package, sorted(str(f) for f in files - shipped))
