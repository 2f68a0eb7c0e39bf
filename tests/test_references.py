"""References resolve inside the repository: code and documentation cite the papers by
the short names of docs/papers.md and the papers' own numbering, never the internal
specification files ("spec 001 section 2.7", "pitfall P10") that users do not have.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("operators", "pipeline", "config", "testing", "docs", "experiments",
           "bench", "tests")  # fmt: skip
# This file names the old pointers on purpose.
SKIPPED = ("tests/test_references.py",)
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt"}
POINTER = re.compile(r"\bspecs?[ /_]*00[0-4]\b|\bpitfalls?\b|shared/papers/specs", re.IGNORECASE)
PAPERS = ROOT / "docs" / "papers.md"


def scanned_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for folder in SCANNED:
        files += [p for p in sorted((ROOT / folder).rglob("*")) if p.suffix in SUFFIXES]
    return [p for p in files if not str(p.relative_to(ROOT)).startswith(SKIPPED)]


def pointers(path: Path) -> list[str]:
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if POINTER.search(line):
            out.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return out


def test_no_pointer_to_the_internal_specification_files():
    found = [hit for path in scanned_files() for hit in pointers(path)]
    assert not found, "cite the paper and its section (docs/papers.md):\n" + "\n".join(found)


@pytest.mark.parametrize(
    "name",
    ["George et al.", "Dong-Luo-Yi", "Andersson-Pagh-Torkamani", "Rameshwar et al.",
     "Andersson et al. (expiration)", "Henzinger-Upadhyay-Upadhyay",
     "Fichtenberger-Henzinger-Upadhyay", "Dvijotham et al. (BLT)", "Canonne-Kamath-Steinke",
     "Bun-Steinke"],
)  # fmt: skip
def test_every_short_name_is_defined_in_docs_papers(name):
    assert f"| {name} |" in PAPERS.read_text(encoding="utf-8")
