"""A headless Chromium driven by Selenium, for the tests and scripts that open
memopt's HTML pages in a real browser (Debian's ``chromium`` and
``chromium-driver``, Selenium from PyPI; ``.ci/run`` installs them)."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

#: Flags that run Chromium headless here (no sandbox as root, no GPU) and
#: keep it from calling home (no component updates, sync, QUIC...).
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage")

#: A proxy nobody listens on: with it every network request fails, so a page
#: that loads and draws under it needs no network.
NO_NETWORK = "--proxy-server=http://127.0.0.1:9"


def binaries() -> tuple:
    """``(chromium, chromedriver)`` paths, or None for one not installed."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    return chromium, shutil.which("chromedriver")


@contextlib.contextmanager
def chromium(width: int = 1400, height: int = 1000, offline: bool = True):
    """A Selenium Chrome driver on headless Chromium with a fresh profile,
    its browser console log kept; ``offline``: every network request fails."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chrome, driver_path = binaries()
    profile = tempfile.mkdtemp(prefix="memopt-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chrome
    for flag in FLAGS:
        options.add_argument(flag)
    if offline:
        options.add_argument(NO_NETWORK)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_argument(f"--window-size={width},{height}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def open_page(driver, path: str, timeout: float = 10.0) -> None:
    """Open the file ``path`` and wait until its script has drawn it
    (``<body data-ready="1">``)."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get("file://" + os.path.abspath(path))
    WebDriverWait(driver, timeout).until(
        lambda d: d.execute_script("return document.body.getAttribute('data-ready')") == "1")


def console_problems(driver) -> list:
    """Browser console entries of level WARNING or worse since the last call."""
    return [e for e in driver.get_log("browser") if e.get("level") in ("SEVERE", "WARNING")]
