"""A real browser for the Spark UI tests: Debian's headless Chromium driven through chromedriver (Selenium),
installed with apt the first time (``regional.testing.debian``)."""

from __future__ import annotations

import shutil
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def headless_chromium(width: int = 1400, height: int = 1300) -> Any:
    """A Selenium WebDriver of a headless Chromium; ``quit()`` it when done."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    from regional.testing.debian import ensure

    ensure(["chromium", "chromium-driver"], lambda: bool(shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)),
           "a headless Chromium and its chromedriver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     f"--window-size={width},{height}"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
