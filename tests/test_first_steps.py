"""What a new user meets first, checked without Spark: one local master in the README, the docs, the demo and
``local_spark``'s default; no UDF declared before a session exists in a page's code; the distribution's name in
the metadata and in the install lines; getting-started's account of how long a poison record takes."""

from __future__ import annotations

import configparser
import inspect
import re
from pathlib import Path

from regional.protocol.settings import DEFAULTS

ROOT = Path(__file__).resolve().parent.parent
DISTRIBUTION = "pyspark-regional"
MASTER = re.compile(r"""(?:local_spark\(|\.master\(|\.remote\(|--master )['"](local\[[^\]]*\])['"]""")
SESSION = re.compile(r"local_spark\(|getOrCreate\(|SparkSession\.active\(")
UDF = re.compile(r"@(?:F\.)?(?:pandas_)?udf\b|\b(?:F\.)?(?:pandas_)?udf\(")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def words(path: Path) -> str:
    """A page's text with its line breaks as spaces."""
    return " ".join(path.read_text(encoding="utf-8").split())


def python_blocks(text: str) -> str:
    """A page's ```python blocks, in order, as one program (how a reader runs the page top to bottom)."""
    return "\n".join(re.findall(r"^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL))


def test_one_local_master_in_the_readme_the_docs_the_demo_and_the_default():
    from regional.spark.session import local_spark

    default = inspect.signature(local_spark).parameters["master"].default
    found = {f"{path.relative_to(ROOT)}: {m}" for path in [*pages(), ROOT / "python" / "regional" / "demo.py"]
             for m in MASTER.findall(path.read_text(encoding="utf-8"))}
    assert found, "no local master found: the pattern no longer matches the examples"
    assert {f.rsplit(": ", 1)[1] for f in found} == {default}, sorted(f for f in found if not f.endswith(default))
    shape = re.fullmatch(r"local\[\d+,(\d+)\]", default)
    assert shape is not None, default
    assert int(shape.group(1)) > int(DEFAULTS["regionAttempts"])  # room for the attempt that quarantines a region
    assert "3 attempts per task, one more than `regionAttempts`" in words(ROOT / "docs" / "getting-started.md")


def test_no_page_declares_a_udf_before_its_session():
    """``@F.udf("bigint")`` parses its type with the active session: declared before ``local_spark`` it raises
    ``SESSION_OR_CONTEXT_NOT_EXISTS`` when a reader runs the page as written."""
    checked = 0
    for path in pages():
        code = python_blocks(path.read_text(encoding="utf-8"))
        udf = UDF.search(code)
        if udf is None:
            continue
        session = SESSION.search(code)
        assert session is not None and session.start() < udf.start(), (
            f"{path.relative_to(ROOT)}: a UDF is declared before the page's session: {udf.group(0)!r}")
        checked += 1
    assert checked, "no page declares a UDF: the pattern no longer matches the examples"


def test_the_distribution_name_in_the_metadata_and_the_install_lines():
    config = configparser.ConfigParser(interpolation=None)
    config.read(ROOT / "setup.cfg", encoding="utf-8")
    assert config["metadata"]["name"] == DISTRIBUTION
    assert config["metadata"]["license_files"].strip() == "LICENSE"
    assert (ROOT / "LICENSE").read_text(encoding="utf-8").lstrip().startswith("Apache License\n")
    for name in ("README.md", "docs/getting-started.md", "docs/index.md"):
        text = (ROOT / name).read_text(encoding="utf-8")
        assert re.search(rf"pip install (-q )?'?{DISTRIBUTION}\b", text), name
        assert not re.search(r"pip install (-q )?'?regional\b", text), name  # PyPI's `regional` is another project


def test_getting_started_says_how_long_a_poison_record_takes_and_how_to_shorten_it():
    text = words(ROOT / "docs" / "getting-started.md")
    retries, backoff = DEFAULTS["deadLetterRetries"], DEFAULTS["deadLetterRetryBackoff"]
    assert f"With the defaults (`{retries}` and `{backoff}`) that is 4 minutes of waits" in text
    assert '.option("deadLetterRetries", "0")' in text and '.option("deadLetterRetryBackoff", "0")' in text
