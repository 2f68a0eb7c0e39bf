"""The project's modules import one another without cycles, and in one direction:
operators know nothing of config or pipeline, config nothing of pipeline. The unit tests
mirror the packages, and no test module imports another or conftest.

Every import counts, wherever it is written (top level, ``if TYPE_CHECKING:``, inside a
function): a cycle hidden behind one is still a cycle of the design.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"operators": "dpstream.operators", "statistics": "dpstream.statistics",
            "pipeline": "dpstream.pipeline", "config": "dpstream.config",
            "deploy": "dpstream.deploy", "testing": "dpstream.testing",
            "client": "dpstream.client"}  # fmt: skip


def modules() -> dict[str, Path]:
    out = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            name = ".".join((package, *parts)).removesuffix(".__init__")
            out[name] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``name`` imports (a package's import of its submodule counts)."""
    is_package = path.name == "__init__.py"
    base = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base.rsplit(".", node.level - 1)[0] if node.level > 1 else base
                module = f"{anchor}.{node.module}" if node.module else anchor
            else:
                module = node.module or ""
            # "from pkg import sub" imports the submodule; other names come from pkg itself.
            subs = [f"{module}.{alias.name}" for alias in node.names]
            targets = [t for t in subs if t in known]
            if len(targets) < len(subs):
                targets.append(module)
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    edges = {name: imports_of(name, path, set(mods)) for name, path in mods.items()}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_one():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]


# What each family package of operators/ may import besides its own modules and the shared
# top-level ones (docs/architecture.md): the families form a DAG with noise at the bottom.
OPERATOR_FAMILIES = {
    "noise": set(),
    "trees": {"noise"},
    "selection": {"noise"},
    "user_level": {"noise", "trees"},
    "means": {"noise", "trees", "selection"},
    "cells": {"noise", "selection"},
    "accounting": {"trees", "means"},
    "baselines": {"noise", "trees", "user_level", "means"},
}
SHARED_OPERATOR_MODULES = {"errors", "_validate", "state_codec"}


def operator_part(name: str) -> str:
    """The family (or shared module) an operators module belongs to; "" for the package."""
    return name.removeprefix("dpstream.operators").removeprefix(".").partition(".")[0]


def declared_all(init: Path) -> list[str]:
    """The names an ``__init__.py`` lists in ``__all__`` (empty if it has none)."""
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    return []


def test_operators_is_the_listed_families_each_exporting_its_modules():
    folder = ROOT / "operators"
    assert {p.parent.name for p in folder.glob("*/__init__.py")} == set(OPERATOR_FAMILIES)
    assert {p.stem for p in folder.glob("*.py")} - {"__init__"} == SHARED_OPERATOR_MODULES
    for family in OPERATOR_FAMILIES:
        exported = declared_all(folder / family / "__init__.py")
        public = {p.stem for p in (folder / family).glob("*.py") if not p.stem.startswith("_")}
        assert public <= set(exported), family
        assert len(exported) == len(set(exported)), family


def test_imports_go_one_way():
    for name, targets in graph().items():
        if name.startswith("dpstream.operators"):
            assert all(t.startswith("dpstream.operators") for t in targets), (name, targets)
            part = operator_part(name)
            if part in OPERATOR_FAMILIES:
                allowed = {part} | OPERATOR_FAMILIES[part] | SHARED_OPERATOR_MODULES
            elif part in SHARED_OPERATOR_MODULES:
                allowed = SHARED_OPERATOR_MODULES
            else:  # the package itself: it loads the production families
                allowed = set(OPERATOR_FAMILIES) - {"baselines"} | SHARED_OPERATOR_MODULES
            # "" is the package dpstream.operators, which loads every family: never from within.
            assert {operator_part(t) for t in targets} <= allowed, (name, targets)
        if name.startswith(("dpstream.config", "dpstream.deploy")):
            assert not any(t.startswith("dpstream.pipeline") for t in targets), (name, targets)
        if not name.startswith("dpstream.testing"):  # the pytest plugin: for users' tests
            assert not any(t.startswith("dpstream.testing") for t in targets), (name, targets)


# What each layer above operators/ may import besides itself (docs/architecture.md): the
# statistics layer only the mechanisms and the config; the pipeline's sub-packages in the
# order of the data flow (wire formats, Kafka clients, the ingest, the stages, the worker,
# the tools), each only those before it.
LAYERS = {
    "statistics": {"config", "operators"},
    "pipeline.wire": {"config", "operators", "statistics"},
    "pipeline.kafka": {"config", "operators", "pipeline.wire"},
    "pipeline.ingest": {"config", "operators", "statistics", "pipeline.wire", "pipeline.kafka"},
    "pipeline.stages": {"config", "operators", "statistics", "pipeline.wire"},
    "pipeline.worker": {
        "config",
        "operators",
        "statistics",
        "pipeline.wire",
        "pipeline.kafka",
        "pipeline.ingest",
        "pipeline.stages",
    },
    "pipeline.tools": {
        "client",
        "config",
        "deploy",
        "operators",
        "statistics",
        "pipeline.wire",
        "pipeline.kafka",
        "pipeline.ingest",
        "pipeline.stages",
        "pipeline.worker",
    },
    # The downstream client reads the published records: their shapes (statistics) and
    # the Kafka clients' settings, never the worker.
    "client": {"config", "operators", "statistics", "pipeline.wire", "pipeline.kafka"},
}
# Kafka and Faust stay out of the statistics layer (and so out of everything replay and the
# stages' tests need below the transport).
TRANSPORT_LIBRARIES = ("faust", "mode", "aiokafka", "confluent_kafka", "kafka")


def layer(name: str) -> str:
    """``statistics``, ``pipeline.<sub-package>``, or the top-level package of ``name``."""
    parts = name.split(".")
    if parts[1] == "pipeline" and len(parts) > 2:
        return f"pipeline.{parts[2]}"
    return parts[1]


def test_the_layers_import_downwards_only():
    assert {p.parent.name for p in (ROOT / "pipeline").glob("*/__init__.py")} == {
        name.removeprefix("pipeline.") for name in LAYERS if name.startswith("pipeline.")
    }
    assert {p.stem for p in (ROOT / "pipeline").glob("*.py")} == {"__init__"}
    for name, targets in graph().items():
        own = layer(name)
        if own in LAYERS:
            assert {layer(t) for t in targets} - {own} <= LAYERS[own], (name, targets)


def test_the_statistics_layer_imports_no_kafka_and_no_faust():
    for name, path in modules().items():
        if layer(name) == "statistics":
            found = {m.partition(".")[0] for m in imported_modules(path.read_text())}
            assert not found & set(TRANSPORT_LIBRARIES), (name, found)


def test_the_client_imports_no_faust():
    # A downstream reader installs dpstream for its records, not for the worker's stack.
    for name, path in modules().items():
        if layer(name) == "client":
            found = {m.partition(".")[0] for m in imported_modules(path.read_text())}
            assert not found & {"faust", "mode"}, (name, found)


def test_the_baselines_stay_out_of_the_production_import_path():
    # Experiment-only mechanisms: tests and experiments/ import them, nothing else does.
    for name, targets in graph().items():
        if not name.startswith("dpstream.operators.baselines"):
            assert not any(t.startswith("dpstream.operators.baselines") for t in targets), name


def imported_modules(source: str) -> set[str]:
    """Every module ``source`` imports, by dotted name, and every name it imports from a
    package (``from tests.integration import test_faults`` imports ``test_faults``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            found.add(module)
            prefix = module if module.endswith(".") else f"{module}."
            found.update(prefix + alias.name for alias in node.names)
    return found


def forbidden_imports(source: str) -> list[str]:
    """The imports of conftest or of a ``test_*`` module in ``source``."""
    return sorted(
        name
        for name in imported_modules(source)
        if (last := name.rpartition(".")[2]) == "conftest" or last.startswith("test_")
    )


def test_no_test_module_imports_conftest_or_another_test_module():
    # Shared helpers live in plain modules (tests/noise_doubles.py,
    # tests/integration/support.py) and fixtures in conftest plugins, which pytest loads.
    for path in sorted((ROOT / "tests").rglob("*.py")):
        assert forbidden_imports(path.read_text(encoding="utf-8")) == [], path


def test_the_import_check_finds_conftest_and_test_modules():
    source = """
import tests.conftest
from tests.conftest import wait_until
from tests.integration import test_faults, support
from .test_svt import dlap_tail
from . import conftest
from tests.noise_doubles import NodeNoise
"""
    assert forbidden_imports(source) == [
        ".conftest",
        ".test_svt",
        "tests.conftest",
        "tests.integration.test_faults",
    ]


# Unit tests mirror the packages (docs/architecture.md): tests/<folder>/test_<name>.py tests
# the module, subpackage or package <folder>/<name>; test_<name>_<aspect>.py one aspect of
# it. The running system's tests and the privacy audits test no one module; the rules of
# the whole repository (this file among them) sit at the top of tests/.
NOT_MIRRORED = {"integration", "audit"}


def mirrored_name(test_file: Path) -> str | None:
    """What a unit test file under tests/ should be named after, or None if it tests the
    module, subpackage or package it is named after (``test_stages_identity.py`` tests
    ``stages``); a folder that mirrors no package answers with its path."""
    folder = test_file.parent.relative_to(ROOT / "tests")
    package = ROOT / folder
    if not package.is_dir() or not any(package.glob("*.py")):
        return str(folder)
    names = {p.stem for p in package.glob("*.py")} - {"__init__"}
    names |= {p.parent.name for p in package.glob("*/__init__.py")} | {package.name}
    tested = test_file.stem.removeprefix("test_")
    if any(tested == name or tested.startswith(f"{name}_") for name in names):
        return None
    return tested


def test_unit_tests_mirror_the_packages():
    unit_tests = [
        path
        for path in sorted((ROOT / "tests").rglob("test_*.py"))
        if path.parent != ROOT / "tests"
        and path.relative_to(ROOT / "tests").parts[0] not in NOT_MIRRORED
    ]
    assert unit_tests
    for path in unit_tests:
        assert mirrored_name(path) is None, path.relative_to(ROOT)


def test_the_mirror_check_finds_a_misnamed_test_and_a_folder_without_package():
    assert mirrored_name(ROOT / "tests" / "pipeline" / "test_stages_identity.py") is None
    assert mirrored_name(ROOT / "tests" / "operators" / "noise" / "test_bits.py") is None
    assert mirrored_name(ROOT / "tests" / "pipeline" / "test_noise_identity.py") == (
        "noise_identity"
    )
    assert mirrored_name(ROOT / "tests" / "statistical" / "test_x.py") == "statistical"
