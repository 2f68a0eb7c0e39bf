"""``dpstream dashboard`` in a real browser: headless Chromium (Debian's chromium and
chromium-driver, driven by selenium) loads the page of a running pipeline while traffic
flows, and the test fails unless each statistic's series advances on the page (the latest
tick and the number of points read from the DOM), with the dead letters counted. A
screenshot goes to the test's tmp dir (and, with ``DPSTREAM_DASHBOARD_SCREENSHOT=path``,
there too: docs/img/dashboard.png was made so).

Without chromium or chromedriver the test skips (`make browser` installs them), except
under ``CI=true``, where it fails: CI must prove the page works. A browser that is
installed but does not start fails the test.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from dpstream.pipeline.kafka.clients import make_producer, produce_events
from tests import record_kinds
from tests.integration.support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.browser]

KEY_ENV = "DPSTREAM_TEST_KEY"
TICK = 0.5
STATISTICS = ["views", "views_auto", "ratings", "median_rating", "temperature"]
HINT = "chromium and chromedriver are not installed (`make browser`: Debian's packages)"


def browser_or_skip() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{HINT}; CI must run the browser test", pytrace=False)
        pytest.skip(HINT)
    return chromium, driver


def headless(chromium: str, driver: str):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1200,2200"):  # fmt: skip
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(driver), options=options)


def traffic(bootstrap: str, cfg, stop: threading.Event) -> None:
    """A round of events (and the bad records) every tick until ``stop``."""
    producer = make_producer(bootstrap)
    rng = random.Random(9)
    statistics = cfg.model_dump()["statistics"]
    while not stop.is_set():
        produce_events(producer, cfg, record_kinds.round_of_events(rng, statistics))
        for bad in record_kinds.BAD_RECORDS:
            producer.produce(cfg.input.topics[0], value=bad)
        producer.flush(10)
        stop.wait(TICK)


def start_dashboard(config: Path, bootstrap: str, log: Path) -> tuple[subprocess.Popen, str]:
    with log.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dpstream.pipeline.tools.cli", "dashboard", "--config",
             str(config), "--bootstrap", bootstrap, "--port", "0"],
            stdout=subprocess.PIPE, stderr=stderr, text=True,
        )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "dashboard: http://127.0.0.1:PORT/" once it listens
    if not line.startswith("dashboard: "):
        proc.kill()
        proc.communicate()
        raise AssertionError(f"the dashboard did not start:\n{log.read_text()}")
    return proc, line.split(" ", 1)[1].strip()


def shown(browser) -> dict[str, tuple[int, int]]:
    """Per statistic on the page: (latest tick, points) (-1 before any release), read in
    one script: the page redraws every second, so elements found earlier go stale."""
    rows = browser.execute_script(
        "return [...document.querySelectorAll('.statistic')].map("
        "s => [s.dataset.statistic, s.dataset.latestTick, s.dataset.points])"
    )
    return {name: (int(tick or -1), int(points or 0)) for name, tick, points in rows}


def text(browser, element_id: str) -> str:
    return str(browser.execute_script(f"return document.getElementById('{element_id}').innerText"))


def test_the_dashboard_shows_the_series_advancing(bootstrap, worker_factory, tmp_path):
    chromium, driver = browser_or_skip()
    data = record_kinds.config(False, {"mode": "keyed", "key_env": KEY_ENV}, TICK)
    data["statistics"] = [s for s in data["statistics"] if s["name"] in STATISTICS]
    worker = worker_factory(data, env={KEY_ENV: np.random.default_rng(8).bytes(32).hex()})
    stop = threading.Event()
    producing = threading.Thread(target=traffic, args=(bootstrap, worker.cfg, stop))
    producing.start()
    dashboard, url = start_dashboard(worker.config_path, bootstrap, tmp_path / "dashboard.log")
    browser = headless(chromium, driver)  # a browser that does not start fails here
    try:
        browser.get(url)
        wait_until(lambda: set(shown(browser)) == set(STATISTICS), 60, "the page", worker)

        def every_statistic_released() -> bool:
            return all(tick >= 0 for tick, _ in shown(browser).values())

        wait_until(every_statistic_released, 120, "every statistic on the page", worker)
        first = shown(browser)

        def advanced() -> bool:
            now = shown(browser)
            return all(now[n][0] >= first[n][0] + 3 and now[n][1] > first[n][1] for n in STATISTICS)

        wait_until(advanced, 120, "three more ticks of every series on the page", worker)
        wait_until(
            lambda: int(text(browser, "dead-total").split()[0]) > 0,
            60,
            "the dead letters counted",
        )
        assert text(browser, "app") == worker.cfg.app_id
        views = text(browser, "stat-views")
        assert "How many 'view' events there have been so far" in views
        assert "95% interval" in views and "epsilon = 1" in views
        # The band of the count, and the tracked tau of a tau: auto statistic, are drawn.
        drawn = "return document.querySelectorAll('#stat-{} {}').length"
        assert browser.execute_script(drawn.format("views", "polygon")) == 1
        assert browser.execute_script(drawn.format("views_auto", "svg")) == 2
        assert "Tracked contribution bound tau" in text(browser, "stat-views_auto")
        assert text(browser, "problems") == ""
        assert "source records not yet read" in text(browser, "lag-total")
        screenshot = tmp_path / "dashboard.png"
        assert browser.save_screenshot(str(screenshot))
        if os.environ.get("DPSTREAM_DASHBOARD_SCREENSHOT"):
            shutil.copy(screenshot, os.environ["DPSTREAM_DASHBOARD_SCREENSHOT"])
    finally:
        browser.quit()
        stop.set()
        producing.join()
        dashboard.terminate()
        try:
            dashboard.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            dashboard.kill()
            dashboard.communicate()
    assert dashboard.returncode == 0, (tmp_path / "dashboard.log").read_text()
