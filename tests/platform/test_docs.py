"""The user and design docs say what the code does: README's config table lists every config key,
its Quick start is the two lines CI runs, docs/architecture.md lists the layers the layering test
enforces and links every subsystem page, and the repository paths and benchmark modules the docs
name exist."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

from paddle_mla.config.schema import EngineConfig

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# pages with their own owners and history; not part of the user / design set checked here
UNCHECKED_PAGES = {"triton_decode_notes.md", "benchmarks_history.md"}
QUICK_START = [
    "pip install -e '.[torch]' && echo '{\"id\": \"hello\", \"prompt\": \"The capital of France is\"}' "
    "| paddle-mla generate",
    "pip install -e '.[torch,paddle,test,ray]' && bash scripts/test.sh",
]
REPO_PATH = re.compile(r"\b(?:paddle_mla|custom_ops|tests|configs|examples|docs|scripts|benchmarks)/[\w/.-]*\w"
                       r"\.(?:py|md|yaml|sh|h|cu|cuh|cc)\b")
# ``python -m benchmarks.<group>.<name>``: a module of the benchmarks package
BENCH_MODULE = re.compile(r"-m (benchmarks(?:\.\w+)+)")
MD_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _config_keys(cls=EngineConfig, prefix: str = "") -> list[str]:
    keys = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.default_factory if f.default_factory is not dataclasses.MISSING else None):
            keys += _config_keys(f.default_factory, f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


def _checked_docs() -> list[Path]:
    pages = [p for p in sorted(DOCS.glob("*.md")) if p.name not in UNCHECKED_PAGES]
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "tests" / "README.md", *pages]


def test_readme_config_table_lists_every_key():
    readme = (ROOT / "README.md").read_text()
    rows = set(re.findall(r"^\| `([\w.]+)` \|", readme, flags=re.M))
    keys = _config_keys()
    assert "parallel.data_parallel_size" in keys
    missing = [k for k in keys if k not in rows]
    assert not missing, f"README's Configuration table lacks {missing}"


def test_readme_config_defaults_match_the_schema():
    readme = (ROOT / "README.md").read_text()
    defaults = dict(re.findall(r"^\| `([\w.]+)` \| `([^`]*)` \|", readme, flags=re.M))
    flat = {}

    def walk(obj, prefix=""):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                walk(value, f"{prefix}{f.name}.")
            else:
                flat[prefix + f.name] = value

    walk(EngineConfig())
    wrong = {}
    for key, value in flat.items():
        shown = defaults.get(key)
        expected = str(value).lower() if isinstance(value, bool) else str(value)
        if shown is not None and shown != expected:
            wrong[key] = (shown, expected)
    assert not wrong, f"README default differs from schema.py (README, code): {wrong}"


def test_readme_quick_start_is_what_ci_runs():
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index("## Quick start")
    fence = next(i for i in range(start, len(lines)) if lines[i] == "```bash")
    end = next(i for i in range(fence + 1, len(lines)) if lines[i] == "```")
    assert lines[fence + 1:end] == QUICK_START


def test_readme_has_no_dated_runs_tracker_numbers_or_for_now():
    text = (ROOT / "README.md").read_text()
    hits = re.findall(r".*(?:\bissues? [0-9]+|20[0-9]{2}-[01][0-9]-[0-3][0-9]|for now\b).*", text)
    assert not hits, hits


def test_architecture_lists_the_enforced_layers_in_order():
    tree = ast.parse((ROOT / "tests" / "unit" / "test_layers.py").read_text())
    layers = next(ast.literal_eval(n.value) for n in ast.walk(tree)
                  if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "LAYERS")
    text = (DOCS / "architecture.md").read_text()
    block = text.split("## Layers", 1)[1].split("```", 2)[1]
    listed = [line.split()[0] for line in block.splitlines() if line.strip()]
    assert listed == layers
    headings = re.findall(r"^## (\w+) \(`paddle_mla/(\w+)/`\)", text, flags=re.M)
    assert [h for h, _ in headings] == layers and all(h == p for h, p in headings)


def test_architecture_links_every_subsystem_page():
    text = (DOCS / "architecture.md").read_text()
    linked = set(MD_LINK.findall(text))
    pages = {p.name for p in DOCS.glob("*.md")} - {"architecture.md", "benchmarks_history.md"}
    assert pages <= linked, f"docs/architecture.md does not link {sorted(pages - linked)}"


def test_paths_named_in_the_docs_exist():
    missing = []
    for doc in _checked_docs():
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            for path in REPO_PATH.findall(line):
                if not (ROOT / path).exists():
                    missing.append(f"{doc.relative_to(ROOT)}:{n}: {path}")
            for module in BENCH_MODULE.findall(line):
                if not (ROOT / (module.replace(".", "/") + ".py")).exists():
                    missing.append(f"{doc.relative_to(ROOT)}:{n}: module {module}")
            for link in MD_LINK.findall(line):
                if "://" not in link and not (doc.parent / link).exists():
                    missing.append(f"{doc.relative_to(ROOT)}:{n}: link {link}")
    assert not missing, "\n".join(missing)


def test_benchmarks_sections_named_in_the_docs_exist():
    """``BENCHMARKS.md, "Section"`` (and ``"A" and "B"``) name headings BENCHMARKS.md has."""
    headings = set(re.findall(r"^#+ (.+?)\s*$", (ROOT / "BENCHMARKS.md").read_text(), flags=re.M))
    missing = []
    for doc in _checked_docs():
        text = " ".join(doc.read_text().split())       # a reference may wrap over lines
        for names in re.findall(r'BENCHMARKS\.md, ((?:"[^"]+"(?:,| and| or)? ?)+)', text):
            missing += [f"{doc.relative_to(ROOT)}: {name}" for name in re.findall(r'"([^"]+)"', names)
                        if name not in headings]
    assert not missing, "\n".join(missing)
