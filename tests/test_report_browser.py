"""A generated report.html opened in headless Chromium (Debian's chromium + chromium-driver,
driven by Selenium): the charts render (SVG marks in the DOM), the console has no error, the page
loads nothing from the network, and a screenshot is kept in the test's tmp folder."""
import shutil
import time

import pytest
import yaml

from dsim.cli import main
from helpers import scenario


def _browser():
    chrome = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
    driver = shutil.which("chromedriver")
    if chrome is None or driver is None:
        pytest.skip("no headless browser: apt-get install chromium chromium-driver (.ci/run does)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install 'dsim[dev]')")
    o = Options()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,1600"):
        o.add_argument(a)
    o.binary_location = chrome
    o.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=o)


def test_run_report_renders_in_chromium(tmp_path):
    drv = _browser()
    try:
        doc = scenario()
        doc["output"] = {"plots": True}
        doc["workload"] = {"type": "poisson", "rate": 10, "num_requests": 60, "prompt_tokens": 100, "output_tokens": 8}
        s = tmp_path / "s.yaml"
        s.write_text(yaml.safe_dump(doc))
        assert main(["run", str(s), "--out", str(tmp_path / "r"), "--quiet"]) == 0
        page = (tmp_path / "r" / "report.html").resolve()
        drv.get(page.as_uri())
        n_charts = drv.execute_script("return document.querySelectorAll('.chart').length")
        deadline = time.time() + 10
        while time.time() < deadline:           # vega-embed draws asynchronously
            svgs = drv.execute_script("return document.querySelectorAll('.chart svg').length")
            if svgs >= n_charts:
                break
            time.sleep(0.2)
        assert n_charts >= 2 and svgs == n_charts
        marks = drv.execute_script("return document.querySelectorAll('.chart svg .mark-line path, "
                                   ".chart svg .mark-symbol path, .chart svg .mark-area path').length")
        assert marks > 10
        errors = [e for e in drv.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        assert errors == []
        fetched = drv.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
        assert fetched == []                    # nothing loaded from anywhere: the file is self-contained
        h = drv.execute_script("return document.body.scrollHeight")
        drv.set_window_size(1200, min(h + 40, 4000))
        shot = tmp_path / "report.png"
        assert drv.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
        print(f"screenshot: {shot}")
    finally:
        drv.quit()
