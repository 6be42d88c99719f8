"""The documentation site: it builds with ``mkdocs build --strict`` (broken links, missing pages and API
references fail), its generated parts come from the code, and the README keeps the commands CI runs.
The site's Python examples are run by integration/test_docs_examples.py (they need Spark)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "mkdocs_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mkdocs_hooks"] = module
    spec.loader.exec_module(module)
    return module


def test_the_site_builds_strict(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "REGIONAL_DOCS_STRICT": "1"})
    assert done.returncode == 0, done.stderr[-6000:]
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
