"""The documentation site built the way its tests need it: ``mkdocs build --strict`` (a warning fails) into a
directory of the test's own, the generated parts strict too (``REGIONAL_DOCS_STRICT``). tests/test_docs.py reads
its HTML, integration/test_docs_html.py shows it in a browser."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def build_site(where: Path) -> Path:
    """The site of this checkout built into ``where`` (which it returns); an AssertionError with mkdocs's output
    when the build fails."""
    if not (ROOT / "mkdocs.yml").is_file():
        raise FileNotFoundError(f"regional: no mkdocs.yml at {ROOT}: build the site from a checkout of regional")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(where)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "REGIONAL_DOCS_STRICT": "1"})
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-6000:]}"
    return where
