"""MkDocs hooks (mkdocs.yml ``hooks:``): the parts of the documentation that are rendered from the code.

- ``<!-- options: regional.inputs.kafka -->`` becomes the module's ``OPTIONS`` table (``regional.options.markdown``);
  ``<!-- options: regional.spark.reader:READ_OPTIONS -->`` names another attribute. The docs' options tables are
  the declarations the reader and writer check a query's options against, so they cannot drift from the code.
- ``<!-- include: BENCHMARKS.md -->`` becomes that top-level file of the repository (its ``docs/`` links made
  relative to the site).
- ``<!-- errors -->`` becomes the catalogue of every error regional raises, read from the source with ``ast``:
  each ``raise Regional...Error(...)`` / ``raise RowsRejected(...)`` / ``raise RowsInvalid(...)`` with its message, by
  module. A value the code fills in reads as a plain word (``<region>``, ``<count>``, ``<type>``, ``<...>`` for
  anything more involved, ``placeholder()``), constants are spelled out, and the text is escaped: no code, no HTML
  tag, no markdown emphasis reaches the page.
- ``<!-- fields: regional.store.model:RegionState -->`` becomes the table of that class's fields, with what the
  source's comments say of each (``fields_table()``).

``examples()`` lists the Python examples of the pages, in the site's order, for the test that runs them
(integration/test_docs_examples.py). A ``<!-- docs-test: ... -->`` line right before a block says what it needs:
``kafka`` (and ``topic=<name>`` to create), ``postgres``, or ``skip: <why>``.

A module that declares no table yet renders a visible note instead of failing the build, unless
``STRICT_OPTIONS`` (or the environment's ``REGIONAL_DOCS_STRICT=1``) is set.
"""

from __future__ import annotations

import ast
import importlib
import io
import os
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
PACKAGE = ROOT / "python" / "regional"
STRICT_OPTIONS = False

_OPTIONS = re.compile(r"<!--\s*options:\s*([\w.]+)(?::(\w+))?\s*-->")
_ERRORS = re.compile(r"<!--\s*errors\s*-->")
_FIELDS = re.compile(r"<!--\s*fields:\s*([\w.]+):(\w+)\s*-->")
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
    return _code_aware_escape(markdown(table))


def _missing(why: str) -> str:
    if STRICT_OPTIONS or os.environ.get("REGIONAL_DOCS_STRICT") == "1":
        raise RuntimeError(f"options table missing: {why}")
    return f'!!! note "Options table not generated"\n    {why}; its options are described in the text below.\n'


def _constants(tree: ast.Module) -> dict[str, str]:
    """A module's constants (``NEW_QUERY = ("...")``, ``DRIVER_RETRY_S = 30``, ``LEVELS = ("a", "b")``, the last
    joined with ", "), so a message that quotes one reads as the user sees it."""
    found = {}
    for node in tree.body:
        target, value = (node.target, node.value) if isinstance(node, ast.AnnAssign) else (
            (node.targets[0], node.value) if isinstance(node, ast.Assign) and len(node.targets) == 1 else (None, None))
        if not isinstance(target, ast.Name) or value is None:
            continue
        if isinstance(value, ast.Constant) and isinstance(value.value, (str, int, float)) and not isinstance(
                value.value, bool):
            found[target.id] = str(value.value)
        elif (isinstance(value, (ast.Tuple, ast.List, ast.Set)) and value.elts
              and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts)):
            found[target.id] = ", ".join(str(e.value) for e in value.elts if isinstance(e, ast.Constant))
    return found


_KNOWN: dict[str, str] = {}


def _message(node: ast.expr | None) -> str:
    """A raise's message as the user sees it, with ``<...>`` where the code fills in a value."""
    if node is None:
        return ""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if _known(node) is not None:
        return _known(node) or ""
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            elif isinstance(value, ast.FormattedValue):
                inner = value.value
                known = _known(inner)
                if known is not None:
                    parts.append(known)
                else:
                    parts.append(f"<{placeholder(inner)}>")
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        return _message(node.left) + (_message(node.right) if isinstance(node.op, ast.Add) else "")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        return _message(node.func.value)
    return f"<{placeholder(node)}>"


def _known(node: ast.expr) -> str | None:
    """A constant's value (``NEW_START``, ``', '.join(ISOLATION_LEVELS)``, ``sorted(LEVELS)``), or None."""
    if isinstance(node, ast.Name):
        return _KNOWN.get(node.id)
    if (isinstance(node, ast.Call) and _called(node) in ("join", "sorted", "list", "str") and len(node.args) == 1
            and isinstance(node.args[0], ast.Name)):
        return _KNOWN.get(node.args[0].id)
    return None


# Names too short to read, or that read as something else (``todo[p]``, a partition's end position, showed as
# "<todo>": an unfinished page), and what they stand for in regional's messages.
_LETTERS = {"k": "key", "t": "topic", "r": "region", "e": "error", "exc": "error", "p": "n", "o": "n", "i": "n",
            "n": "n", "self": "value", "lo": "start", "hi": "end", "st_size": "size", "todo": "n"}
# Calls whose value reads as their (first) argument's: ``str(path)``, ``', '.join(missing)``, ``sorted(names)``.
_CALLED = {"_named": "exception"}
_TRANSPARENT = {"str", "repr", "sorted", "list", "set", "tuple", "join", "strip", "describe", "_describe",
                "safe_url", "splitlines", "abs", "int", "float", "format", "dict"}


def placeholder(node: ast.expr) -> str:
    """What a message's filled-in value is, as a word a reader understands: the variable's or attribute's name
    (``self._committed[region]`` -> ``committed``, ``span.first_offset`` -> ``first offset``), ``type`` for
    ``type(x).__name__``, ``count`` for ``len(x)``, ``...`` for anything more involved. Never code."""
    word = _word(node)
    return word if word else "..."


def _word(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return _words(node.id)
    if isinstance(node, ast.Constant):
        return _words(node.value) if isinstance(node.value, str) and node.value.isidentifier() else (
            node.value if isinstance(node.value, str) and re.fullmatch(r"[\w ,.'-]+", node.value) else "")
    if isinstance(node, ast.Attribute):
        if node.attr == "__name__" and isinstance(node.value, ast.Call) and _called(node.value) == "type":
            return "type"
        if node.attr in ("__name__", "__qualname__"):
            return "name"
        return _words(node.attr)
    if isinstance(node, ast.Subscript):  # names[:8], options[name], a[0]: what the collection holds
        if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            return _words(node.slice.value)
        return _word(node.value)
    if isinstance(node, ast.Call):
        called = _called(node)
        if called == "len":
            return "count"
        if called in _TRANSPARENT:
            if node.args and not (called == "join" and isinstance(node.func, ast.Name)):
                return _word(node.args[0])
            return _word(node.func.value) if isinstance(node.func, ast.Attribute) else ""
        if called == "get" and node.args:  # row.get('offset')
            return _word(node.args[0])
        if called in ("map", "max", "min") and node.args:  # map(str, regions), max(lo, committed(region))
            return _word(node.args[-1] if called == "map" else node.args[0])
        if called in _CALLED:
            return _CALLED[called]
        if called.lstrip("_").startswith("describe_"):  # _describe_holder(holder)
            return _words(called.lstrip("_").removeprefix("describe_"))
        return _words(called.removeprefix("get_").removesuffix("_of")) if called else ""
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):  # query.name or query.id
        return _word(node.values[0])
    if isinstance(node, (ast.GeneratorExp, ast.ListComp)):  # ', '.join(f'kafka.{k}' for k in given)
        return _word(node.generators[0].iter)
    return ""


def _called(node: ast.Call) -> str:
    return node.func.id if isinstance(node.func, ast.Name) else node.func.attr if isinstance(
        node.func, ast.Attribute) else ""


def _words(name: str) -> str:
    """``_committed`` -> ``committed``, ``region_name`` -> ``region name``, ``NEW_START`` -> ``new start``;
    camelCase (Spark's and regional's option names, ``batchId``) stays as it is."""
    name = name.strip("_")
    if name in _LETTERS:
        return _LETTERS[name]
    if len(name) == 1:
        return "value"
    return name.replace("_", " ").lower() if name.isupper() or "_" in name else name


def raised_errors(package: Path = PACKAGE) -> dict[str, list[tuple[str, str]]]:
    """Module (dotted) -> [(error class, message)] for every error regional raises, outside ``regional.testing``."""
    found: dict[str, list[tuple[str, str]]] = {}
    trees = {path: ast.parse(path.read_text(encoding="utf-8")) for path in sorted(package.rglob("*.py"))}
    everywhere: dict[str, str] = {}  # a constant imported from another module reads as its value there
    for tree in trees.values():
        everywhere.update(_constants(tree))
    errors = _constants(trees[package / "errors.py"])
    _KNOWN.clear()
    _KNOWN.update({**everywhere, **errors})
    for tree in trees.values():  # NEW_START = f"or, ... {NEW_QUERY}": spelled out with the constants it quotes
        for statement in tree.body:
            if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                    and isinstance(statement.targets[0], ast.Name) and isinstance(statement.value, ast.JoinedStr)):
                everywhere[statement.targets[0].id] = _message(statement.value)
    for path, tree in trees.items():
        relative = path.relative_to(package.parent).with_suffix("")
        module = ".".join(relative.parts).removesuffix(".__init__")
        if module.startswith("regional.testing"):
            continue
        _KNOWN.clear()
        _KNOWN.update({**everywhere, **errors, **_constants(tree)})
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
        # The side navigation cuts a long dotted name to its first ~25 characters (four modules read
        # "regional.inputs.deadletter_t..."): it shows the module's last parts.
        lines.append(f'\n### `{module}` {{ data-toc-label="{nav_label(module)}" }}\n')
        lines.append("| error | message |")
        lines.append("| --- | --- |")
        for name, message in entries:
            text = " ".join(message.split()).replace("`", "'")
            lines.append(f"| `{name}` | {plain(text)} |")
    return "\n".join(lines) + "\n"


def nav_label(module: str, most: int = 24) -> str:
    """A module's name as short as the side navigation shows whole: without ``regional.``, then its last two
    parts, then its last part (``regional.inputs.deadletter_topic.letters`` -> ``deadletter_topic.letters``)."""
    name = module.removeprefix("regional.")
    for label in (name, ".".join(name.split(".")[-2:])):
        if len(label) <= most:
            return label
    return name.split(".")[-1]


def plain(text: str) -> str:
    """Text to show as it is in a markdown table cell: no HTML tags (``<region>`` is shown, not swallowed by the
    browser), no emphasis (``__name__``), no cell breaks."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "&#124;")
    return re.sub(r"([\\*_\[\]])", r"\\\1", text)


def _code_aware_escape(markdown: str) -> str:
    """``<`` and ``>`` outside code spans as entities: an options table's ``(regional-<query id>, epoch)`` shows
    ``<query id>`` instead of an unknown HTML tag the browser swallows."""
    parts = re.split(r"(`[^`]*`)", markdown)
    return "".join(part if part.startswith("`") else part.replace("<", "&lt;").replace(">", "&gt;")
                   for part in parts)


def fields_table(module_name: str, class_name: str) -> str:
    """The markdown table of a class's fields (a NamedTuple's or dataclass's annotated names): name, type,
    default and what its source's comments say of it (the one at the end of its line, else the lines right above
    it), read from the source so it cannot drift from the code."""
    path = PACKAGE.parent.joinpath(*module_name.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    source = path.read_text(encoding="utf-8")
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
    lines = source.splitlines()
    found = next((node for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.ClassDef) and node.name == class_name), None)
    if found is None:
        raise RuntimeError(f"fields table: {module_name} has no class {class_name}")
    rows = ["| field | type | default | meaning |", "| --- | --- | --- | --- |"]
    group, last = "", 0  # a comment above several fields (``alone_since``, ``probe_passed``, ...) speaks of each
    for node in found.body:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        meaning = comments.get(node.end_lineno or node.lineno, "")
        above: list[str] = []
        line = node.lineno - 1
        while line >= 1 and lines[line - 1].strip().startswith("#"):
            above.insert(0, comments.get(line, ""))
            line -= 1
        if above:
            group = node.target.id
            meaning = " ".join([*above, meaning])
        elif not meaning and group and last == node.lineno - 1:
            meaning = f"see `{group}`"
        elif not meaning:
            group = ""
        last = node.end_lineno or node.lineno
        default = "" if node.value is None else f"`{ast.unparse(node.value)}`"
        kind = ast.unparse(node.annotation).replace(" | ", " or ")
        text = " ".join(meaning.split()).replace("|", "&#124;")
        rows.append(f"| `{node.target.id}` | `{kind}` | {default} | {_code_aware_escape(text)} |")
    return "\n".join(rows) + "\n"


def include(name: str) -> str:
    """A top-level file of the repository (BENCHMARKS.md, RELIABILITY.md, CHANGELOG.md) as a page's text."""
    return _DOCS_LINK.sub("](", (ROOT / name).read_text(encoding="utf-8"))


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    markdown = _INCLUDE.sub(lambda m: include(m.group(1)), markdown)
    markdown = _OPTIONS.sub(lambda m: options_table(m.group(1), m.group(2) or "OPTIONS"), markdown)
    markdown = _FIELDS.sub(lambda m: fields_table(m.group(1), m.group(2)), markdown)
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
