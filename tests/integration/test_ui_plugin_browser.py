"""The UI plugin as a person uses it: Debian's chromium (scripts/chromium.sh), driven by Playwright, against a
real Airflow API server with the plugin installed (test_ui_plugin.py's ``ui_server``) on an Airflow-made
duplicate. Log in through Airflow's own form, open "HA health" from Airflow's Browse menu, see the
finding, follow its link to the kept run's tab, open the duplicate run's tab.

Each page is screenshot into the test's directory, or into ``DUPGUARD_UI_SCREENSHOTS`` when set (the
pictures in docs/how-to/ui-plugin.md were taken so).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from playwright import sync_api as playwright  # a test dependency (pyproject.toml): missing is a failure

from tests.integration.test_ui_plugin import CASES, PASSWORDS, UiServer, ui_server
from tests.pg import Templates

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
WAIT_MS = 60_000  # the first page waits for one scan and one doctor on a shared, busy machine


@pytest.fixture(scope="module", params=sorted(CASES))
def ui(
    request: pytest.FixtureRequest, pg_templates: Templates, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[UiServer]:
    if not os.path.exists(CHROMIUM):
        pytest.fail("chromium is missing: run scripts/chromium.sh", pytrace=False)
    version: str = request.param
    with ui_server(version, pg_templates, tmp_path_factory.mktemp(f"ui-browser-{version}")) as server:
        yield server


@pytest.fixture
def browser() -> Iterator[playwright.Browser]:
    with playwright.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


def _shots(tmp_path: Path) -> Path:
    out = Path(os.environ.get("DUPGUARD_UI_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


def _login(browser: playwright.Browser, ui: UiServer, user: str) -> playwright.Page:
    page = browser.new_page(viewport={"width": 1100, "height": 640})
    page.goto(ui.server.url + "/")
    page.fill("input[name='username']", user)
    page.fill("input[name='password']", PASSWORDS[user])
    page.click("button[type='submit']")
    page.wait_for_url(ui.server.url + "/", timeout=WAIT_MS)
    return page


def _frame(page: playwright.Page) -> playwright.FrameLocator:
    return page.frame_locator("iframe")


def test_a_reader_finds_the_duplicate_and_follows_it_to_the_kept_run(
    ui: UiServer, browser: playwright.Browser, tmp_path: Path
) -> None:
    shots, version = _shots(tmp_path), ui.server.version
    page = _login(browser, ui, "viewer")
    page.get_by_role("button", name="Browse").click()
    page.get_by_role("menuitem", name="HA health").click()
    frame = _frame(page)
    playwright.expect(frame.get_by_role("heading", name="HA health")).to_be_visible(timeout=WAIT_MS)
    # the first page after the server started may say "reading" and reload itself: wait for the finding
    playwright.expect(frame.get_by_text(f"1 duplicate(s) of run {ui.kept}")).to_be_visible(timeout=WAIT_MS)
    page.screenshot(path=shots / f"ui-plugin-nav-{version}.png")

    # the link leaves the frame: Airflow's own page moves to the kept run's HA health tab
    frame.get_by_role("link", name=ui.kept).first.click()
    page.wait_for_url(f"**/dags/{ui.dag_id}/runs/{quote(ui.kept, safe='')}/plugin/ha-health-run", timeout=WAIT_MS)
    playwright.expect(_frame(page).get_by_text("This run is the kept run of a duplicate group")).to_be_visible(
        timeout=WAIT_MS
    )
    page.screenshot(path=shots / f"ui-plugin-kept-run-{version}.png")

    page.goto(f"{ui.server.url}/dags/{ui.dag_id}/runs/{quote(ui.duplicate, safe='')}")
    page.get_by_role("link", name="HA health", exact=True).click()
    playwright.expect(_frame(page).get_by_text(f"This run is a duplicate of {ui.kept}")).to_be_visible(timeout=WAIT_MS)
    page.screenshot(path=shots / f"ui-plugin-duplicate-run-{version}.png")


def test_a_user_without_access_to_the_dag_sees_no_finding_of_it(
    ui: UiServer, browser: playwright.Browser, tmp_path: Path
) -> None:
    page = _login(browser, ui, "outsider")
    page.goto(ui.server.url + "/plugin/ha-health")
    frame = _frame(page)
    playwright.expect(frame.get_by_role("heading", name="HA health")).to_be_visible(timeout=WAIT_MS)
    playwright.expect(frame.get_by_text("No open finding")).to_be_visible(timeout=WAIT_MS)
    assert ui.kept not in frame.locator("body").inner_text()
    page.screenshot(path=_shots(tmp_path) / f"ui-plugin-outsider-{ui.server.version}.png")
