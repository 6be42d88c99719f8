"""The Regional tab of the Spark UI in a real browser (headless Chromium), and a real scrape of the driver's
metrics (Spark's PrometheusServlet and regional's labelled /metrics/regional), against a query in a driver of its
own whose region b's target is down, then heals; then the query stops and the tab still shows how it ended."""

from __future__ import annotations

import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from integration.helpers import ROOT
from integration.ui_child import EVIL_REGIONS, REGIONS, ROWS
from regional.store.status import status
from regional.testing.kafka_broker import free_port


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def eventually(check, timeout: float = 120, what: str = ""):
    """``check()``'s first truthy value, asked every 0.3 s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f}s: {what}")
        time.sleep(0.3)


def scrape(base: str) -> dict[str, float]:
    """Spark's /metrics/prometheus, parsed: sample name -> value (regional's sources only)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {s.name: s.value for f in text_string_to_metric_families(fetch(base + "/metrics/prometheus"))
            for s in f.samples if "_driver_regional_ui_test_" in s.name}


def figure(samples: dict[str, float], name: str) -> float:
    """The query's figure: its source is ``regional.<name>_<the query id's first 8 characters>``."""
    pattern = re.compile(rf"_driver_regional_ui_test_[0-9a-f]{{8}}_{name}_Value$")
    found = [v for k, v in samples.items() if pattern.search(k)]
    assert len(found) == 1, (name, sorted(samples))
    return found[0]


def regions_in_browser(browser, url: str) -> dict[str, tuple[str, str]]:
    """region id -> (state, ref_epoch) as the tab's regions table shows them."""
    from selenium.webdriver.common.by import By

    browser.get(url)
    rows = browser.find_elements(By.CSS_SELECTOR, "#regional-regions tbody tr")
    return {r.find_element(By.CLASS_NAME, "regional-region-id").text:
            (r.find_element(By.CLASS_NAME, "regional-state").text,
             r.find_element(By.CLASS_NAME, "regional-ref-epoch").text) for r in rows}


class ChildLines:
    """The child's output, read by a thread (a blocked read must never hang the test), searched by prefix."""

    def __init__(self, child: subprocess.Popen[str]) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, args=(child,), daemon=True).start()

    def _read(self, child: subprocess.Popen[str]) -> None:
        assert child.stdout is not None
        for line in child.stdout:
            self.lines.put(line)
        self.lines.put("")  # the end

    def expect(self, prefix: str, timeout: float = 180) -> str:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            self.seen.append(line)
            if line.startswith(prefix):
                return line.strip()
            if line == "":
                break
        raise AssertionError(f"the child did not print {prefix!r}:\n{''.join(self.seen)[-3000:]}")


def ensure_promtool() -> None:
    from regional.testing.debian import ensure

    ensure(["prometheus"], lambda: shutil.which("promtool") is not None, "Prometheus' promtool")


@pytest.fixture(scope="module")
def browser():
    from regional.testing.browser import headless_chromium

    ensure_promtool()

    driver = headless_chromium()
    yield driver
    driver.quit()


def test_the_regional_tab_and_the_metrics_show_a_fallen_back_region_then_its_recovery(browser, tmp_path):
    from prometheus_client.parser import text_string_to_metric_families
    from selenium.webdriver.common.by import By

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    ck = tmp_path / "ck"
    (tmp_path / "b_down").touch()
    child = subprocess.Popen([sys.executable, "-m", "integration.ui_child", str(tmp_path), str(port)], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = ChildLines(child)
        query_id = lines.expect("started ").split()[1]

        # Every region but b has published all its rows; b has fallen back to where it started (-1).
        def settled():
            st = status(ck)
            done = st.regions and all(st.regions[r].committed_offset == ROWS for r in REGIONS if r != "b")
            return st if done and st.regions["b"].ref_epoch == -1 else None

        st = eventually(settled, what="regions other than b published, b fallen back")

        # The browser: the tab is in Spark's navigation, lists the query, and its page shows b fallen back.
        browser.get(base + "/jobs/")
        browser.find_element(By.LINK_TEXT, "Regional").click()
        browser.find_element(By.LINK_TEXT, "ui_test").click()
        assert query_id in browser.find_element(By.ID, "regional-summary").text
        page = browser.current_url
        shown = eventually(lambda: (s := regions_in_browser(browser, page)).get("b", ("", ""))[0] == "fallen_back"
                           and s, 30, "b fallen back in the tab")
        assert shown["b"] == ("fallen_back", "-1")
        assert shown["a"] == ("ok", "-")
        for evil in EVIL_REGIONS:  # shown as text, never run
            assert shown[evil] == ("ok", "-"), shown
        assert browser.execute_script("return window.regionalPwned") is None
        assert browser.find_elements(By.ID, "regional-timeline")
        screenshot = Path(os.environ.get("REGIONAL_UI_SCREENSHOT") or tmp_path / "spark-ui-tab.png")
        browser.save_screenshot(str(screenshot))

        # The scrape: Spark's PrometheusServlet, matched against the store at the same epoch.
        def scrape_at_store_epoch():
            samples = scrape(base)
            now = status(ck)
            return (samples, now) if samples and figure(samples, "epoch") == now.last_epoch else None

        samples, st = eventually(scrape_at_store_epoch, 60, "a scrape at the store's newest epoch")
        progress = st.progress()
        assert figure(samples, "regions_fallen_back") == progress.fallen_back == 1
        assert figure(samples, "regions") == len(REGIONS)
        age_epochs, age_s = st.ref_age("b")
        assert figure(samples, "oldest_ref_epoch_age_epochs") == age_epochs == st.last_epoch + 1
        assert age_s is not None and 0 <= age_s - figure(samples, "oldest_ref_epoch_age_seconds") <= 5
        assert figure(samples, "region_b_lag") == st.lag("b") == ROWS
        # regional's own endpoint: the same figures with labels, ids escaped in the text format and read back.
        text = fetch(base + "/metrics/regional")
        labelled = {(s.name, s.labels.get("region")): s.value for f in text_string_to_metric_families(text)
                    for s in f.samples if s.labels.get("query") == "ui_test"}
        checked = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        assert checked.returncode == 0, checked.stdout + checked.stderr  # Prometheus' own linter of the format
        assert labelled[("regional_regions_fallen_back", None)] == 1
        assert labelled[("regional_region_lag", "b")] == ROWS
        for evil in EVIL_REGIONS:
            assert labelled[("regional_region_lag", evil)] == 0
        # Every figure the docs' alert rules and Grafana dashboard use is one the endpoint serves.
        served = {name for name, _ in labelled}
        used = set(re.findall(r"regional_[a-z_]+", (ROOT / "docs" / "prometheus-alerts.yml").read_text()
                              + (ROOT / "docs" / "grafana-regional.json").read_text()))
        assert used and used <= served, used - served

        # The target heals: b catches up, the tab and the metrics show it current.
        (tmp_path / "b_down").unlink()
        eventually(lambda: status(ck).regions["b"].committed_offset == ROWS, what="b caught up")
        shown = eventually(lambda: (s := regions_in_browser(browser, page))["b"][0] == "ok" and s, 30,
                           "b current in the tab")
        assert shown["b"] == ("ok", "-")
        eventually(lambda: figure(scrape(base), "regions_fallen_back") == 0, 30, "no region fallen back in metrics")

        # The query stops: the tab still shows it, as stopped, with its regions.
        (tmp_path / "stop").touch()
        lines.expect("stopped")
        browser.get(base + "/regional/")
        assert "stopped" in browser.find_element(By.ID, "regional-queries").text
        assert regions_in_browser(browser, page)["b"] == ("ok", "-")
        (tmp_path / "exit").touch()
        assert child.wait(timeout=120) == 0
    finally:
        (tmp_path / "stop").touch()
        (tmp_path / "exit").touch()
        if child.poll() is None:
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()


def test_the_alert_rules_pass_promtool():
    """docs/prometheus-alerts.yml, checked by Prometheus' own promtool (Debian's prometheus package)."""
    ensure_promtool()
    result = subprocess.run(["promtool", "check", "rules", str(ROOT / "docs" / "prometheus-alerts.yml")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 3 rules found" in result.stdout, result.stdout
