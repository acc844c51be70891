"""The HTML report of the tiny pipeline, opened in headless Chromium: every table, figure and the
scorecard is listed under its study, each opens (images load, tables show), captions say what they mirror."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from PIL import Image
from support.common import REPO
from support.webdriver import Browser, find_browser

pytestmark = pytest.mark.slow

BROWSER = find_browser()
NEEDS_BROWSER = pytest.mark.skipif(
    BROWSER is None, reason="chromium and chromedriver are not installed (`make test` installs them as root: "
                            "apt-get install chromium chromium-driver)")

# Click the navigation entry whose visible text is exactly arguments[0]; false when there is none.
CLICK_NAV = """const els = [...document.querySelectorAll('nav a')].filter(e => e.innerText.trim() === arguments[0]);
if (!els.length) return false; els[0].click(); return true;"""
# The result rows the navigation lists now: [label, row index].
LISTED = """return [...document.querySelectorAll('nav table tbody tr')].map(
    (tr, i) => [tr.querySelector('td').innerText.trim(), i]);"""
# Open (eye) or describe (information) the i-th listed result.
CLICK_ROW = """const tr = document.querySelectorAll('nav table tbody tr')[arguments[0]];
tr.querySelector(`a[iconname="${arguments[1]}"]`).click(); return true;"""
# The result the app shows now, once the content pane displays exactly that result's file (image or page).
OPENED = """const path = app.state.resultPath;
if (!path || !results[path]) return null;
const shown = [...document.querySelectorAll('img, iframe')].some(e => e.src === results[path].data_uri);
return shown ? path : null;"""
# Wait until every image on the page has loaded, then report those that failed (naturalWidth 0).
BROKEN_IMAGES = """const done = arguments[arguments.length - 1];
const imgs = [...document.images];
Promise.all(imgs.map(i => i.complete ? null : new Promise(r => { i.onload = r; i.onerror = r; })))
  .then(() => done({
    n: imgs.length,
    broken: imgs.filter(i => i.naturalWidth === 0).map(i => i.src.slice(0, 80)),
    shown: imgs.filter(i => i.src.startsWith('data:image/png')).map(i => [i.naturalWidth, i.naturalHeight])}));"""


def wait_for(browser: Browser, script: str, *args, timeout: float = 20.0):
    """Poll a script until it returns something truthy (the single-page app renders asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        value = browser.js(script, *args)
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def show_list(browser: Browser, report, sub: str) -> None:
    """Open the report and list study feddisco's ``sub`` (tables or figures)."""
    browser.open(report.as_uri())
    assert wait_for(browser, CLICK_NAV, "feddisco"), "study feddisco is not listed"
    assert wait_for(browser, CLICK_NAV, sub), f"feddisco has no {sub}"


@pytest.fixture(scope="module")
def tiny_report(tiny_pipeline):
    workdir, config, proc = tiny_pipeline
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = workdir / "results" / "report.html"
    made = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory",
                           str(workdir), "--configfile", str(config), "--report", str(report)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    return report


@NEEDS_BROWSER
def test_report_lists_and_shows_every_table_figure_and_the_scorecard(tiny_report, tmp_path):
    from fedrepro.config import load_yaml

    study = load_yaml(REPO / "tests" / "data" / "tiny_study.yaml")
    expected = {"tables": set(study["tables"]), "figures": set(study["figures"])}
    listed: dict[str, list[str]] = {}
    opened: list[str] = []
    with Browser(*BROWSER) as browser:
        browser.open(tiny_report.as_uri())
        assert wait_for(browser, "return document.querySelector('nav') !== null"), "the report did not render"
        browser.screenshot(tmp_path / "home.png")
        for sub in ("tables", "figures"):
            show_list(browser, tiny_report, sub)
            listed[sub] = [label for label, _ in wait_for(browser, LISTED)]
            for i, label in enumerate(listed[sub]):
                if i:  # the caption view replaced the list: back to it through the breadcrumbs
                    assert wait_for(browser, CLICK_NAV, sub), f"no way back to the {sub}"
                    assert [lab for lab, _ in wait_for(browser, LISTED)] == listed[sub]
                browser.js(CLICK_ROW, i, "eye")
                opened.append(wait_for(browser, OPENED))
                assert opened[-1], f"{label}: clicking it showed nothing"
                if sub == "figures":
                    result = browser.js_async(BROKEN_IMAGES)
                    assert result["broken"] == [], f"{label}: broken images {result['broken']}"
                    # the figure itself: a PNG the browser decoded, at a readable size
                    assert result["shown"] and min(w for w, _ in result["shown"]) >= 600, (label, result)
                    browser.screenshot(tmp_path / f"figure{i}.png")
                else:
                    content = wait_for(browser, "return document.querySelector('iframe') && "
                                                "document.querySelector('iframe').src.slice(0, 40)")
                    assert content and content.startswith("data:text/html"), (label, content)
                browser.js(CLICK_ROW, i, "information-circle")
                caption = wait_for(browser, "const t = document.querySelector('nav').innerText; "
                                            "return t.includes('Scale:') ? t : null")
                assert caption, f"{label}: no caption"
                assert "Mirrors:" in caption and "embedded" in caption, caption
        browser.open(tiny_report.as_uri())
        assert wait_for(browser, CLICK_NAV, "scorecard"), "the scorecard is not listed"
        rows = wait_for(browser, LISTED)
        assert len(rows) == 1
        browser.js(CLICK_ROW, 0, "eye")
        assert wait_for(browser, "return document.querySelector('iframe') !== null")
        assert browser.js_async(BROKEN_IMAGES)["broken"] == []

    assert len(set(opened)) == len(opened) == sum(map(len, expected.values())), opened  # each its own file
    for sub, names in expected.items():
        shown = {label.split(":")[0] for label in listed[sub]}
        assert shown == names, f"{sub}: listed {sorted(shown)}, the study declares {sorted(names)}"
    for shot in ("home.png", "figure0.png", "figure1.png"):
        with Image.open(tmp_path / shot) as img:
            assert img.size[0] >= 1000
            # not a blank page: many distinct colours
            assert len(img.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 50, shot
