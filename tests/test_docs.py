"""The documentation site: it builds with ``mkdocs build --strict`` (broken links, missing pages and API
references fail), its generated parts come from the code, and the README keeps the commands CI runs.
The site's Python examples are run by integration/test_docs_examples.py (they need Spark)."""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from types import ModuleType

import pytest

from regional.testing.docs_site import build_site

ROOT = Path(__file__).resolve().parent.parent


def hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "mkdocs_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mkdocs_hooks"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once for this module's tests (strictly: a warning fails)."""
    return build_site(tmp_path_factory.mktemp("docs") / "site")


def test_the_site_builds_strict(site):
    tmp_path = site.parent
    index = (tmp_path / "site" / "index.html").read_text()
    assert "regional" in index
    # The options tables and the error catalogue were rendered from the code, not left as markers.
    for page in ("sources/kafka", "targets/delta", "options", "troubleshooting"):
        html = (tmp_path / "site" / page / "index.html").read_text()
        assert "<!-- options:" not in html and "<!-- errors -->" not in html, page
    troubleshooting = (tmp_path / "site" / "troubleshooting" / "index.html").read_text()
    assert "another driver is running the query of" in troubleshooting


def test_an_options_marker_becomes_the_modules_table():
    from regional.inputs.generator import OPTIONS

    table = hooks().options_table("regional.inputs.generator")
    assert table.splitlines()[0] == "| option | default | meaning |"
    for option in OPTIONS.options:
        assert f"`{option.name}`" in table


def test_a_module_without_a_table_renders_a_note_unless_strict(monkeypatch):
    module = hooks()
    assert "declares no `OPTIONS` table" in module.options_table("regional.errors")
    assert "cannot be imported" in module.options_table("regional.no_such_module")
    monkeypatch.setenv("REGIONAL_DOCS_STRICT", "1")
    with pytest.raises(RuntimeError, match="options table missing"):
        module.options_table("regional.errors")


def test_the_error_catalogue_holds_every_raise_of_a_regional_error():
    found = hooks().raised_errors()
    raises = 0
    for path in (ROOT / "python" / "regional").rglob("*.py"):
        if "testing" not in path.parts:
            raises += len(re.findall(r"raise (?:Regional\w*Error|RowsRejected|RowsInvalid)\(", path.read_text()))
    listed = sum(len(entries) for entries in found.values())
    assert raises and listed <= raises and listed >= raises * 0.8, (listed, raises)  # the same message is listed once
    messages = [m for entries in found.values() for _, m in entries]
    assert any(m.startswith("another driver is running the query of <") for m in messages)
    assert not any("NEW_QUERY" in m for m in messages)  # constants are spelled out


def test_every_api_reference_names_something_importable():
    for name in re.findall(r"^::: ([\w.]+)", (ROOT / "docs" / "api.md").read_text(), re.M):
        module, _, attribute = name.rpartition(".")
        assert hasattr(importlib.import_module(module), attribute), name


def test_every_options_marker_names_a_module_that_exists():
    markers = []
    for page in (ROOT / "docs").rglob("*.md"):
        markers += re.findall(r"<!--\s*options:\s*([\w.]+)(?::(\w+))?\s*-->", page.read_text())
    assert len(markers) >= 10
    for module, attribute in markers:
        assert hasattr(importlib.import_module(module), attribute or "OPTIONS") or not attribute, (module, attribute)


def test_the_readme_is_short_and_its_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 160
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert f"    {ci}\n" in readme
    assert "    python3 -m venv .venv && .venv/bin/pip install -q -e '.[timeline]' && .venv/bin/python -m regional " \
           "build-shim && .venv/bin/python -m regional.demo\n" in readme


# Every tag the site's pages use (Material's theme, Python-Markdown, pymdownx, mkdocstrings): any other is text
# the browser swallows, as ``(regional-<query id>, epoch)`` once showed "(regional-, epoch)".
_HTML_TAGS = set("""a abbr article aside b blockquote body br button code dd details div dl dt em footer form h1 h2 h3
h4 h5 h6 head header hr html i img input label li link main meta nav ol p path pre script section small span strong
sub summary sup svg table tbody td th thead title tr ul kbd del ins mark caption colgroup col noscript style
iframe picture source figure figcaption""".split())


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.labels: list[str] = []  # the navigation's labels
        self._label: list[str] | None = None
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        if tag == "span" and ("class", "md-ellipsis") in attrs:
            self._label = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "span" and self._label is not None:
            self.labels.append(" ".join("".join(self._label).split()))
            self._label = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._label is not None:
            self._label.append(data)


def _page(site: Path, name: str) -> _Page:
    page = _Page()
    page.feed((site / name / "index.html").read_text())
    return page


def test_every_page_shows_its_text_not_unknown_tags(site):
    for html in sorted(site.rglob("index.html")):
        page = _Page()
        page.feed(html.read_text())
        assert page.tags <= _HTML_TAGS, (html.relative_to(site), page.tags - _HTML_TAGS)
    delta = " ".join(_page(site, "targets/delta").text)
    assert "transaction (regional-<query id>, epoch). Remove the option" in delta  # txnAppId's row


def test_the_error_catalogue_shows_placeholders_not_code(site):
    html = (site / "troubleshooting" / "index.html").read_text()
    catalogue = html.split('id="every-error-from-the-code"', 1)[1]
    text = " ".join(_page(site, "troubleshooting").text).split("Every error, from the code", 1)[1]
    for code in ("**name**", "<strong>name", "__name__", "self.", "<f'", "{len(", "type(", ".join("):
        assert code not in catalogue and code not in text, code
    placeholders = re.findall(r"<([^<>]*)>", text)
    assert len(placeholders) > 100
    odd = sorted({p for p in placeholders if not re.fullmatch(r"[A-Za-z][\w .'-]*|\.\.\.", p)})
    assert not odd, odd  # a word a reader understands (<region>, <count>, <type>), or <...>


def test_the_navigation_shows_module_names_whole_and_apart(site):
    for name in ("troubleshooting", "api"):
        dotted = [label for label in _page(site, name).labels if "." in label and " " not in label]
        assert dotted or name == "api", name  # the API reference names its objects without their module
        # The side navigation shows about 25 characters of a name it cannot wrap.
        assert all(len(label) <= 24 for label in dotted), (name, [lb for lb in dotted if len(lb) > 24])
        assert len(set(dotted)) == len(dotted), name


def test_the_api_reference_has_what_progress_and_status_return(site):
    text = " ".join(_page(site, "api").text)
    assert "Progress" in text
    for field in ("committed_offset", "last_epoch", "dead_letters", "reason", "max_lag", "fallen_back",
                  "outage_suspects", "the next offset to read"):
        assert field in text, field
