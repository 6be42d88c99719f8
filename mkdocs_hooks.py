"""MkDocs hooks (mkdocs.yml ``hooks:``): the parts of the documentation that are rendered from the code.

- ``<!-- options: regional.inputs.kafka -->`` becomes the module's ``OPTIONS`` table (``regional.options.markdown``);
  ``<!-- options: regional.spark.reader:READ_OPTIONS -->`` names another attribute. The docs' options tables are
  the declarations the reader and writer check a query's options against, so they cannot drift from the code.
- ``<!-- include: BENCHMARKS.md -->`` becomes that top-level file of the repository (its ``docs/`` links made
  relative to the site).
- ``<!-- errors -->`` becomes the catalogue of every error regional raises, read from the source with ``ast``:
  each ``raise Regional...Error(...)`` / ``raise RowsRejected(...)`` / ``raise RowsInvalid(...)`` with its message, by
  module.

``examples()`` lists the Python examples of the pages, in the site's order, for the test that runs them
(integration/test_docs_examples.py). A ``<!-- docs-test: ... -->`` line right before a block says what it needs:
``kafka`` (and ``topic=<name>`` to create), ``postgres``, or ``skip: <why>``.

A module that declares no table yet renders a visible note instead of failing the build, unless
``STRICT_OPTIONS`` (or the environment's ``REGIONAL_DOCS_STRICT=1``) is set.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
PACKAGE = ROOT / "python" / "regional"
STRICT_OPTIONS = False

_OPTIONS = re.compile(r"<!--\s*options:\s*([\w.]+)(?::(\w+))?\s*-->")
_ERRORS = re.compile(r"<!--\s*errors\s*-->")
_INCLUDE = re.compile(r"<!--\s*include:\s*([\w.-]+)\s*-->")
# Links in the repository's top-level files that point into docs/ (docs/soak.png) point next to the page on the site.
_DOCS_LINK = re.compile(r"\]\(docs/")


def options_table(module_name: str, attribute: str = "OPTIONS") -> str:
    """The markdown table of ``module_name``'s ``attribute`` (an ``OptionTable``), or a visible note."""
    from regional.options import OptionTable, markdown

    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        return _missing(f"`{module_name}` cannot be imported ({e})")
    table = getattr(module, attribute, None)
    if not isinstance(table, OptionTable):
        return _missing(f"`{module_name}` declares no `{attribute}` table yet")
    return markdown(table)


def _missing(why: str) -> str:
    if STRICT_OPTIONS or os.environ.get("REGIONAL_DOCS_STRICT") == "1":
        raise RuntimeError(f"options table missing: {why}")
    return f'!!! note "Options table not generated"\n    {why}; its options are described in the text below.\n'


def _constants(tree: ast.Module) -> dict[str, str]:
    """A module's string constants (``NEW_QUERY = ("...")``), so a message that quotes one reads as the user sees it."""
    found = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            found[node.targets[0].id] = node.value.value
    return found


_KNOWN: dict[str, str] = {}


def _message(node: ast.expr | None) -> str:
    """A raise's message as the user sees it, with ``<...>`` where the code fills in a value."""
    if node is None:
        return ""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name) and node.id in _KNOWN:
        return _KNOWN[node.id]
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            elif isinstance(value, ast.FormattedValue):
                inner = value.value
                if isinstance(inner, ast.Name) and inner.id in _KNOWN:
                    parts.append(_KNOWN[inner.id])
                else:
                    parts.append(f"<{_short(ast.unparse(inner))}>")
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        return _message(node.left) + (_message(node.right) if isinstance(node.op, ast.Add) else "")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        return _message(node.func.value)
    return f"<{_short(ast.unparse(node))}>"


def _short(expr: str) -> str:
    expr = expr.replace("\n", " ")
    return expr if len(expr) <= 40 else expr[:37] + "..."


def raised_errors(package: Path = PACKAGE) -> dict[str, list[tuple[str, str]]]:
    """Module (dotted) -> [(error class, message)] for every error regional raises, outside ``regional.testing``."""
    found: dict[str, list[tuple[str, str]]] = {}
    _KNOWN.update(_constants(ast.parse((package / "errors.py").read_text(encoding="utf-8"))))
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package.parent).with_suffix("")
        module = ".".join(relative.parts).removesuffix(".__init__")
        if module.startswith("regional.testing"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Raise) or not isinstance(node.exc, ast.Call):
                continue
            func = node.exc.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if not (name.startswith("Regional") or name in ("RowsRejected", "RowsInvalid")):
                continue
            message = _message(node.exc.args[0] if node.exc.args else None)
            entry = (name, message)
            if entry not in found.setdefault(module, []):
                found[module].append(entry)
    return found


def errors_catalogue() -> str:
    lines = []
    for module, entries in raised_errors().items():
        lines.append(f"\n### `{module}`\n")
        lines.append("| error | message |")
        lines.append("| --- | --- |")
        for name, message in entries:
            text = " ".join(message.split()).replace("|", "&#124;").replace("`", "'")
            text = text.replace("<", "&lt;").replace(">", "&gt;")
            lines.append(f"| `{name}` | {text} |")
    return "\n".join(lines) + "\n"


def include(name: str) -> str:
    """A top-level file of the repository (BENCHMARKS.md, RELIABILITY.md, CHANGELOG.md) as a page's text."""
    return _DOCS_LINK.sub("](", (ROOT / name).read_text(encoding="utf-8"))


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    markdown = _INCLUDE.sub(lambda m: include(m.group(1)), markdown)
    markdown = _OPTIONS.sub(lambda m: options_table(m.group(1), m.group(2) or "OPTIONS"), markdown)
    if _ERRORS.search(markdown):
        markdown = _ERRORS.sub(lambda m: errors_catalogue(), markdown)
    return markdown


_FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_MARKER = re.compile(r"<!--\s*docs-test:\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Example:
    """One Python block of a page: ``marker`` is what its ``<!-- docs-test: ... -->`` line says ("" without)."""

    page: str  # relative to docs/
    line: int
    code: str
    marker: str

    @property
    def skip(self) -> str | None:
        return self.marker.split(":", 1)[1].strip() if self.marker.startswith("skip:") else None

    @property
    def needs(self) -> set[str]:
        return {word for word in self.marker.split() if word in ("kafka", "postgres")} if not self.skip else set()

    @property
    def topics(self) -> list[str]:
        return [word.split("=", 1)[1] for word in self.marker.split() if word.startswith("topic=")]


def pages() -> list[str]:
    """The pages in the order of mkdocs.yml's nav (examples of later pages may use what earlier ones made)."""
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:", 1)[1]
    return re.findall(r":\s*([\w/.-]+\.md)\s*$", nav, re.M)


def examples(docs: Path = ROOT / "docs") -> list[Example]:
    found = []
    for page in pages():
        text = (docs / page).read_text(encoding="utf-8")
        for match in _FENCE.finditer(text):
            before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marker = _MARKER.search(before)
            found.append(Example(page, text[:match.start()].count("\n") + 2, match.group(1),
                                 marker.group(1) if marker else ""))
    return found
