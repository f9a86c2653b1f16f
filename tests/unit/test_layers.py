"""Imports go down the layers (docs/architecture.md): a package never imports one above it, at module
level, inside a function or under TYPE_CHECKING alike. A package cycle is then impossible."""

from __future__ import annotations

import ast
from pathlib import Path

# top to bottom; a package may import only itself and the packages after it
LAYERS = ["cli", "integrations", "batch", "engine", "parallel", "worker", "sched", "models", "attention", "cache",
          "ops", "config", "platform"]
PACKAGE = Path(__file__).resolve().parents[2] / "paddle_mla"


def _imports(path: Path, parts: list[str]):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = parts[:len(parts) - node.level + (1 if path.name == "__init__.py" else 0)]
                yield node.lineno, ".".join(base + ([node.module] if node.module else []))
            elif node.module == "paddle_mla":
                for a in node.names:
                    yield node.lineno, f"paddle_mla.{a.name}"
            elif node.module:
                yield node.lineno, node.module


def test_every_package_is_a_known_layer():
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages == set(LAYERS), f"add new packages to LAYERS (and docs/architecture.md): {packages ^ set(LAYERS)}"
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__"}
    assert not modules, f"modules at the top of the package belong in a layer: {sorted(modules)}"


def test_imports_only_go_down():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ["paddle_mla", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if len(parts) < 2 or parts[1] not in LAYERS:
            continue
        src = LAYERS.index(parts[1])
        for line, module in _imports(path, parts):
            target = module.split(".")
            if target[0] != "paddle_mla" or len(target) < 2 or target[1] not in LAYERS:
                continue
            if LAYERS.index(target[1]) < src:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}")
    assert not upward, "imports that go up the layers:\n" + "\n".join(upward)
