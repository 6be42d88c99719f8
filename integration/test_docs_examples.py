"""Every Python example of the documentation runs (docs/*.md, in the site's order), so a renamed option or
function breaks this test, not a reader's first try.

Each page's blocks run in order in one namespace, against the integration run's SparkSession (the examples'
``regional.local_spark(...)`` returns it), on small local data the examples make themselves. Paths under
``/tmp/regional-docs`` point into one directory of this run, shared by the pages in order (Concepts reads the
checkpoint Getting started made); ``localhost:9092`` is the test's Kafka broker and the PostgreSQL URL its
server, for the blocks marked ``<!-- docs-test: kafka -->`` / ``postgres``. A block marked ``skip: <why>`` is
listed with its reason. Blocks that raise fail the page's test, naming the block's line."""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest
from mkdocs_hooks import examples, pages

DOCS_ROOT = "/tmp/regional-docs"
DOCS_KAFKA = "localhost:9092"
DOCS_POSTGRES = "postgresql://postgres@localhost:5432/postgres"

ALL = examples()
PAGES = [p for p in pages() if any(e.page == p for e in ALL)]


@pytest.fixture(scope="module")
def docs_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("regional-docs")


def test_every_example_is_run_or_says_why_not():
    assert len(ALL) >= 20, [e.page for e in ALL]
    for example in ALL:
        assert example.skip is None or len(example.skip) > 20, example  # the reason is a sentence
        assert example.marker == "" or example.skip or example.needs, f"unknown marker: {example}"


@pytest.mark.parametrize("page", PAGES)
def test_the_examples_of_the_page_run(page, spark, docs_root, request):
    namespace: dict = {"__name__": "docs_" + page.replace("/", "_").removesuffix(".md").replace("-", "_")}
    ran = 0
    for example in (e for e in ALL if e.page == page):
        if example.skip:
            continue
        code = example.code.replace(DOCS_ROOT, str(docs_root))
        if "kafka" in example.needs:
            broker = request.getfixturevalue("kafka")
            for topic in example.topics:
                if topic not in broker.admin().list_topics(timeout=30).topics:
                    broker.create_topic(topic, partitions=2)
            code = code.replace(DOCS_KAFKA, broker.bootstrap)
        if "postgres" in example.needs:
            code = code.replace(DOCS_POSTGRES, request.getfixturevalue("postgres").url)
        try:
            exec(compile(code, f"docs/{page}:{example.line}", "exec"), namespace)
        except Exception:
            pytest.fail(f"the example at docs/{page} line {example.line} raised:\n{traceback.format_exc()}")
        ran += 1
    for query in spark.streams.active:  # an example that leaves a query running must not hold later pages
        query.stop()
    assert ran or all(e.skip for e in ALL if e.page == page)


def test_the_examples_only_use_the_documented_places():
    """Examples write under /tmp/regional-docs only (so this test can point them at its own directory)."""
    for example in ALL:
        for line in example.code.splitlines():
            if '"/tmp/' in line:
                assert DOCS_ROOT in line, (example.page, example.line, line)

