"""The built documentation site as a person reads it (issue 58): every page opened in a real headless Chromium
(``file://``), its DOM and visible text checked for what the build let through: code or a placeholder swallowed
as HTML (``<self._committed[region]>``, ``(regional-<query id>, epoch)`` once read "(regional-, epoch)"), a
dunder name turned bold by markdown (``type(region).__name__`` read "type(region).**name**"), and side
navigation labels that are cut or that a reader cannot tell apart (four "regional.inputs.deadletter_t...").
tests/test_docs.py checks the same HTML as text, without a browser; this test sees what the browser makes of
it: the elements it creates, the text it shows, the labels its CSS cuts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from regional.testing.docs_site import build_site

WIDTH = 1400  # a laptop's browser window: the side navigation is shown (Material shows it from 1220 px)

# One pass over a page: what the checks below need, gathered in the browser.
_READ_PAGE = r"""
const XHTML = 'http://www.w3.org/1999/xhtml';
// Elements the browser does not know: a placeholder such as <query id> that markdown passed as HTML.
const unknown = [...document.querySelectorAll('*')]
  .filter(e => e.namespaceURI === XHTML
          && (e instanceof HTMLUnknownElement || (e.localName.includes('-') && !customElements.get(e.localName))))
  .map(e => e.localName);
// The page's text outside code (code shows code on purpose); a code element's text becomes one NUL.
const parts = [];
const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
for (let node = walker.nextNode(); node; node = walker.nextNode()) {
  parts.push(node.parentElement.closest('code, pre, kbd, script, style, svg') ? '\u0000' : node.data);
}
// Emphasis with the characters either side of it (in the page's text, code included).
const emphasis = [...document.querySelectorAll('article strong, article b, article em, article i')]
  .filter(e => !e.closest('code, pre') && !e.querySelector('svg'))
  .map(e => {
    const before = document.createRange();
    before.setStart(e.closest('p, li, td, th, dd, dt, h1, h2, h3, h4, h5, h6, div') || document.body, 0);
    before.setEndBefore(e);
    const after = document.createRange();
    after.setStartAfter(e);
    const block = e.closest('p, li, td, th, dd, dt, h1, h2, h3, h4, h5, h6, div') || document.body;
    after.setEnd(block, block.childNodes.length);
    return [e.localName, e.textContent, before.toString().slice(-1), after.toString().slice(0, 1)];
  });
// The side navigation's labels a reader sees: whether CSS cuts them, and each list's labels (siblings).
const sidebar = document.querySelector('.md-sidebar--primary');
const labels = sidebar ? [...sidebar.querySelectorAll('.md-nav__link')]
  .filter(a => a.checkVisibility())
  .map(a => {
    const shown = a.querySelector('.md-ellipsis') || a;
    return [shown.textContent.trim().replace(/\s+/g, ' '), shown.scrollWidth, shown.clientWidth];
  }) : null;
const lists = sidebar ? [...sidebar.querySelectorAll('ul.md-nav__list')].map(ul =>
  [...ul.children].map(li => li.querySelector('.md-nav__link'))
    .filter(a => a && a.checkVisibility())
    .map(a => a.textContent.trim().replace(/\s+/g, ' '))) : null;
return {unknown: [...new Set(unknown)], text: parts.join(''), emphasis, labels, lists,
        title: document.title};
"""

# Python's dunder names without their underscores: ``__name__`` that markdown made bold reads "name".
_DUNDERS = {n.strip("_") for n in dir(object) + dir(type) + dir(Exception) + dir(dict) if n.startswith("__")} | {
    "main", "init", "file", "all", "version", "slots", "post_init", "enter", "exit", "next", "iter", "len",
    "getitem", "call", "path", "package", "spec", "loader", "builtins", "future", "debug", "annotations"}

# A ``<`` right before what reads as code, in text outside code: a call, an index, a brace, an f-string, an
# attribute of ``self``, a private or dunder name, markdown's asterisks.
_LEAKED_CODE = re.compile(r"<(?=[A-Za-z_])([^<>\n\x00]{0,80})")
_CODE_LIKE = re.compile(r"""[()\[\]{}*"=]|\bself\.|\._|__|^f['"]""")
# A placeholder that reads as an unfinished page: ``end before position <todo>`` (a variable's name).
_UNFINISHED = re.compile(r"<\s*(?:todo|tbd|fixme|xxx)\s*>", re.I)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_site(tmp_path_factory.mktemp("docs") / "site")


@pytest.fixture(scope="module")
def pages(site: Path) -> dict[str, dict[str, Any]]:
    """Every page of the site (``**/index.html``: the API reference is api/index.html) as Chromium shows it."""
    from regional.testing.browser import headless_chromium

    found = sorted(site.rglob("index.html"))
    assert len(found) >= 25 and site / "api" / "index.html" in found, [str(p.relative_to(site)) for p in found]
    browser = headless_chromium(width=WIDTH, height=1000)
    try:
        read: dict[str, dict[str, Any]] = {}
        for page in found:
            browser.get(page.as_uri())
            read[str(page.parent.relative_to(site))] = browser.execute_script(_READ_PAGE)
        return read
    finally:
        browser.quit()


def test_every_page_loads_with_its_navigation(pages):
    for name, page in pages.items():
        assert page["title"] and "regional" in page["title"], (name, page["title"])
        assert page["labels"], f"{name}: no side navigation shown at {WIDTH} px"
        assert "API reference" in [label for label, _, _ in page["labels"]], name


def test_no_placeholder_becomes_an_element_the_browser_does_not_know(pages):
    unknown = {name: page["unknown"] for name, page in pages.items() if page["unknown"]}
    assert not unknown, f"placeholders swallowed as HTML elements (write them as &lt;...&gt; or in code): {unknown}"


def test_no_code_shows_in_the_text_as_a_placeholder(pages):
    leaked = {}
    for name, page in pages.items():
        fragments = [f"<{m}" for m in _LEAKED_CODE.findall(page["text"]) if _CODE_LIKE.search(m)]
        fragments += _UNFINISHED.findall(page["text"])
        if fragments:
            leaked[name] = fragments
    assert not leaked, f"code shown as text, not a placeholder a reader understands: {leaked}"


def test_no_dunder_name_is_turned_into_emphasis(pages):
    mangled = {}
    for name, page in pages.items():
        stars = re.findall(r"\*\*\w+\*\*", page["text"])
        glued = [f"{before}<{tag}>{text}</{tag}>{after}" for tag, text, before, after in page["emphasis"]
                 if re.fullmatch(r"\w+", text)
                 and ((text in _DUNDERS and tag in ("strong", "b"))
                      or re.fullmatch(r"[\w.]", before or " ") or re.fullmatch(r"[\w(]", after or " "))]
        if stars or glued:
            mangled[name] = stars + glued
    assert not mangled, f"markdown emphasis from a name's underscores or asterisks: {mangled}"


def test_the_side_navigation_shows_every_label_whole_and_apart(pages):
    cut, alike = {}, {}
    for name, page in pages.items():
        wide = [f"{label} ({scroll} px in {client} px)" for label, scroll, client in page["labels"]
                if scroll > client or label.endswith(("...", "\u2026"))]
        if wide:
            cut[name] = wide
        twins = sorted({label for labels in page["lists"] for label in labels if labels.count(label) > 1})
        if twins:
            alike[name] = twins
    assert not cut, f"side navigation labels cut at {WIDTH} px: {cut}"
    assert not alike, f"side navigation labels a reader cannot tell apart: {alike}"
