"""Every package's `__init__.py` is its map: its docstring names each of its modules and
subpackages (as `name`, `name.py` or `name/`, or name.py in prose), and every module it
names as `name.py` or `name/` (or by a path from the repository's root) exists. So a
module added unnamed, or a map naming one that moved, fails here. The docs' paths to our
modules are held to the same: each exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = sorted(
    init.parent
    for top in ("oz0", "oz0_common", "oz0_node", "cli")
    for init in (ROOT / top).rglob("__init__.py")
    if "__pycache__" not in init.parts
)
# `name`, `name.py`, `name/`, `a/b/name.py` (backticked), or name.py in prose: what a
# map may call a module.
_NAMED = re.compile(r"`([A-Za-z0-9_./]+)`|(?<![\w/.])([A-Za-z0-9_]+\.py)\b")


def _map(package: Path) -> str:
    return ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""


def _members(package: Path) -> set[str]:
    modules = {p.stem for p in package.glob("*.py") if p.name != "__init__.py"}
    return modules | {p.parent.name for p in package.glob("*/__init__.py")}


def _names(text: str) -> list[str]:
    return [quoted or bare for quoted, bare in _NAMED.findall(text)]


def _named(text: str) -> set[str]:
    return {n.removesuffix(".py").removesuffix("/") for n in _names(text)}


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_map_names_every_module_of_its_package(package: Path) -> None:
    unnamed = sorted(_members(package) - _named(_map(package)))
    assert not unnamed, f"{package.relative_to(ROOT)}/__init__.py does not name {unnamed}"


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_the_map_names_exists(package: Path) -> None:
    missing = []
    for name, _ in _NAMED.findall(_map(package)):  # backticked: in prose, another's may be named
        if not name.endswith((".py", "/")):
            continue  # a function, a flag: not a module's name
        here = package / name if "/" not in name.rstrip("/") else ROOT / name
        if not here.exists():
            missing.append(name)
    where = package.relative_to(ROOT)
    assert not missing, f"{where}/__init__.py names what is not there: {missing}"


# A path from the repository's root to a module or a folder of ours, as the docs write it
# (`oz0/server/edge/attempts.py`, `oz0/store/`); a placeholder (`bench/scenarios/NAME.py`)
# is in capitals. benchmarks-log.md is left out: a log names the code of its day.
_DOC_PATH = re.compile(
    r"(?<![\w/.~-])((?:oz0|oz0_node|oz0_common|cli|bench|fixtures|tests|deploy)/[a-z0-9_/.]*"
    r"(?:\.py\b|/(?![\w*])))"
)


def test_every_module_the_docs_name_exists() -> None:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    missing = [
        f"{doc.relative_to(ROOT)}:{number}: {path}"
        for doc in docs
        if doc.name != "benchmarks-log.md"
        for number, line in enumerate(doc.read_text().splitlines(), 1)
        for path in _DOC_PATH.findall(line)
        if not (ROOT / path).exists()
    ]
    assert not missing, "the docs name what is not there:\n" + "\n".join(missing)
