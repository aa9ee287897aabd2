"""The explorer's page in a real browser: Debian's headless Chromium, driven by Selenium.

Selenium is always given Debian's chromedriver, so Selenium Manager never downloads a
browser or a driver. Without them the test is skipped, except under CI (``CI`` set),
where it fails: CI must install Debian's ``chromium`` and ``chromium-driver``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from qd import history
from qd.rundir import RunDir

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
WAIT_S = 30  # the first page load waits for the server to replay the archive (JAX compiles)


@pytest.fixture
def browser(tmp_path):
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.is_file()]
    if missing:
        message = (
            f"no {' or '.join(missing)}: install Debian's chromium and chromium-driver "
            "(apt-get install chromium chromium-driver)"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-quic",
        f"--user-data-dir={tmp_path / 'chromium'}",
        "--window-size=1400,1000",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver, script: str, expected, timeout: float = WAIT_S):
    """Polls ``script`` (JS returning a value) until it returns ``expected``."""
    deadline = time.monotonic() + timeout
    while (got := driver.execute_script(script)) != expected:
        if time.monotonic() > deadline:
            raise AssertionError(f"{script!r} returned {got!r}, not {expected!r}, after {timeout} s")
        time.sleep(0.05)


def text_of(driver, selector: str) -> str:
    return driver.execute_script(f"return document.querySelector({selector!r}).textContent")


def click_cell(driver, bins: tuple[int, int], island: int, cell: int) -> None:
    """Shows ``island``'s heatmap and clicks the pixel of a 2-D grid's ``cell``: column = its first
    grid coordinate, row 0 = the top of the second axis."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    driver.find_element(By.CSS_SELECTOR, f"#islands button[data-island='{island}']").click()
    wait_for(driver, "return document.querySelector('#heatmap').dataset.island", str(island))
    canvas = driver.find_element(By.ID, "heatmap")
    w, h = bins
    col, row = cell // h, h - 1 - cell % h
    width, height = driver.execute_script(
        "const c = arguments[0]; return [c.clientWidth, c.clientHeight]", canvas
    )
    dx, dy = (col + 0.5) / w * width - width / 2, (row + 0.5) / h * height - height / 2
    ActionChains(driver).move_to_element_with_offset(canvas, round(dx), round(dy)).click().perform()


@pytest.mark.slow
def test_the_page_shows_a_clicked_elite_and_follows_its_lineage(browser, text_run, tmp_path):
    from selenium.webdriver.common.by import By

    from qd.explore import serve

    island = 1
    with RunDir(text_run) as run:
        g, snap = run.geometry, run.snapshot()
        cells = [int(k) for k in snap.filled(island)[1]]
        elites = run.store.get([int(snap.genome_id[island, k]) for k in cells])
        cell, elite = next((k, c) for k, c in zip(cells, elites) if c.parent_ids)
        elite_diff = history.parent_diff(run, elite)
        (parent,) = run.store.get([elite.parent_ids[0]])

    with serve([text_run]) as server:
        browser.get(server.url)
        wait_for(browser, "return document.body.dataset.ready", "1")
        assert browser.find_element(By.ID, "axis-label-x").text.startswith("AST nodes (")
        assert browser.find_element(By.ID, "axis-label-y").text.startswith("numeric constants (")
        click_cell(browser, g.bins, island, cell)

        wait_for(browser, "return document.querySelector('#detail').dataset.candidate", str(elite.id))
        assert text_of(browser, "#detail-text") == elite.text
        assert text_of(browser, "#detail-diff") == elite_diff
        assert browser.find_elements(By.CSS_SELECTOR, "#detail-text span")  # highlighted

        shots = Path(os.environ.get("QD_SCREENSHOT_DIR") or tmp_path)  # the elite, its diff and lineage
        shots.mkdir(parents=True, exist_ok=True)
        assert browser.save_screenshot(str(shots / "explore.png"))
        print(f"screenshot: {shots / 'explore.png'}")

        browser.find_element(By.CSS_SELECTOR, f"#detail-lineage a[data-id='{parent.id}']").click()
        wait_for(browser, "return document.querySelector('#detail').dataset.candidate", str(parent.id))
        assert text_of(browser, "#detail-text") == parent.text


@pytest.mark.slow
def test_a_pareto_cell_opens_its_front_and_a_clicked_point_shows_that_member(browser, pareto_run):
    from selenium.webdriver.common.by import By

    from qd.explore import serve

    with RunDir(pareto_run) as run:
        g, ids = run.geometry, np.asarray(run.fronts().genome_id)
        sizes = (ids >= 0).sum(-1)
        island, cell = (int(v) for v in np.unravel_index(int(np.argmax(sizes)), sizes.shape))
        (member,) = run.store.get([int(ids[island, cell][sizes[island, cell] - 1])])  # the newest member

    with serve([pareto_run]) as server:
        browser.get(server.url)
        wait_for(browser, "return document.body.dataset.ready", "1")
        click_cell(browser, g.bins, island, cell)

        wait_for(browser, "return document.querySelector('#front').dataset.cell", str(cell))
        points = browser.find_elements(By.CSS_SELECTOR, "#front circle.front-point")
        assert len(points) == sizes[island, cell]
        browser.find_element(By.CSS_SELECTOR, f"#front circle[data-id='{member.id}']").click()
        wait_for(browser, "return document.querySelector('#detail').dataset.candidate", str(member.id))
        assert text_of(browser, "#detail-text") == member.text
