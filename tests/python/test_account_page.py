"""The account page (`/account`) in a real headless Chromium, driven by Selenium.

Debian's `chromium` and `chromium-driver` (scripts/deps.sh installs them); nothing is
downloaded, and a missing browser fails the test with the command that installs it. The test
signs in with a key, checks that the balance shown is the store's to the pico-sol, that the
chart of daily spend draws, that a request just made shows in the recent list after a refresh,
and that the page fits a phone's screen. Screenshots are kept as test artifacts in
`tests/python/artifacts/` (gitignored): `account.png` (desktop) and `account-phone.png`.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import sqlite3
import tempfile
from decimal import Decimal

import pytest

from harness import http_json, wait_until

ARTIFACTS = pathlib.Path(__file__).parent / "artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
INSTALL = "apt-get install -y chromium chromium-driver (scripts/deps.sh does it)"


def store_balance(gw, tenant: str) -> Decimal:
    con = sqlite3.connect(f"file:{gw.store_url.removeprefix('sqlite://')}?mode=ro", uri=True)
    (b,) = con.execute("SELECT balance FROM tenants WHERE name = ?", (tenant,)).fetchone()
    con.close()
    return Decimal(int(b)) * Decimal(10) ** -12


def in_flight_is_empty(gw, secret: str) -> bool:
    status, a, _ = http_json("GET", gw.base + "/v1/account", headers={"Authorization": f"Bearer {secret}"})
    return status == 200 and Decimal(a["pending"]["exact"]) == 0 and a["requests_in_flight"] == 0


def chat(gw, secret: str, text: str) -> str:
    status, body, hdrs = http_json(
        "POST", gw.base + "/v1/chat/completions",
        {"model": "aguila", "messages": [{"role": "user", "content": text}]},
        {"Authorization": f"Bearer {secret}"},
    )
    assert status == 200, body
    return hdrs["x-request-id"]


@pytest.fixture
def browser(workdir):
    for path, what in [(CHROMIUM, "chromium"), (DRIVER, "chromedriver")]:
        if not pathlib.Path(path).exists():
            pytest.fail(f"{what} not found at {path}: install it with `{INSTALL}`")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is not installed: pip install -r tests/python/requirements.txt")
    profile = tempfile.mkdtemp(dir=workdir, prefix="chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1280,1400"]:
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=DRIVER, log_output=str(pathlib.Path(workdir) / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=opts)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def test_sign_in_balance_chart_and_a_new_request(gw, browser):
    """Artifacts: tests/python/artifacts/account.png (desktop), account-phone.png (390×844)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    name = "page-tenant"
    _, secret = gw.new_tenant(name, top_up="250.00")
    for i in range(3):
        chat(gw, secret, f"hola {i} [[sim: tokens={5 + i}]]")
    wait_until(lambda: in_flight_is_empty(gw, secret), 10, "the charges to reach the ledger")
    # The page re-renders its tables as data arrives: an element found a moment ago may be
    # gone by the time it is read.
    from selenium.common.exceptions import StaleElementReferenceException
    wait = WebDriverWait(browser, 15, ignored_exceptions=[StaleElementReferenceException])

    browser.get(gw.base + "/account")
    assert browser.find_element(By.ID, "signin").is_displayed()
    browser.find_element(By.ID, "key").send_keys(secret)
    browser.find_element(By.ID, "signin-button").click()
    wait.until(lambda d: d.find_element(By.ID, "balance").text.startswith("S/ "))

    # The key is held by this tab only: sessionStorage, not localStorage, no cookie.
    assert browser.execute_script("return sessionStorage.getItem('quipu.key')") == secret
    assert browser.execute_script("return localStorage.length") == 0
    assert browser.get_cookies() == []

    shown = browser.find_element(By.ID, "balance")
    exact = Decimal(shown.get_attribute("data-exact"))
    assert exact == store_balance(gw, name), (shown.text, exact)
    assert shown.text == f"S/ {exact.quantize(Decimal('0.01'), rounding='ROUND_HALF_UP'):,.2f}"
    assert shown.get_attribute("title") == f"S/ {shown.get_attribute('data-exact')} (exact)"
    assert exact < Decimal("250"), "three requests were charged"

    # The chart: one bar per day of the period, today's drawn.
    svg = wait.until(lambda d: d.find_element(By.ID, "chart-svg"))
    assert svg.get_attribute("data-bars") == "30"
    bars = svg.find_elements(By.CSS_SELECTOR, "rect.bar-rect")
    assert len(bars) == 30
    heights = [float(b.get_attribute("height")) for b in bars]
    assert heights[-1] > 0 and max(heights) == heights[-1], heights
    spent = sum(Decimal(b.get_attribute("data-exact")) for b in bars)
    assert spent == Decimal("250") - exact
    assert svg.size["width"] > 600 and svg.size["height"] > 150
    models = browser.find_elements(By.CSS_SELECTOR, "#models .model-row")
    assert [m.get_attribute("data-model") for m in models] == ["aguila"]
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "account.png"))

    rows = browser.find_elements(By.CSS_SELECTOR, "#requests tbody tr")
    assert len(rows) == 3
    keys = browser.find_elements(By.CSS_SELECTOR, "#keys tbody tr")
    assert len(keys) == 1

    # A request made now shows at the top of the list after a refresh.
    rid = chat(gw, secret, "otra [[sim: tokens=9]]")
    wait_until(lambda: in_flight_is_empty(gw, secret), 10, "the new charge to reach the ledger")
    browser.find_element(By.ID, "refresh").click()
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#requests tbody tr").get_attribute("data-id") == rid)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#requests tbody tr")) == 4
    wait.until(lambda d: Decimal(d.find_element(By.ID, "balance").get_attribute("data-exact"))
               == store_balance(gw, name))

    # No request was blocked by the page's Content-Security-Policy, nothing failed to load.
    logs = [e for e in browser.get_log("browser")
            if e["level"] in ("SEVERE", "WARNING") and "favicon.ico" not in e["message"]]
    assert not logs, json.dumps(logs, indent=1)

    # On a phone: nothing wider than the screen, the figures still there.
    browser.set_window_size(390, 844)
    browser.refresh()
    wait.until(lambda d: d.find_element(By.ID, "balance").text.startswith("S/ "))
    width = browser.execute_script("return window.innerWidth")
    scroll = browser.execute_script("return document.documentElement.scrollWidth")
    assert scroll <= width, (scroll, width)
    assert browser.find_element(By.ID, "chart-svg").size["width"] <= width
    browser.save_screenshot(str(ARTIFACTS / "account-phone.png"))

    # Signing out forgets the key.
    browser.find_element(By.ID, "signout").click()
    assert browser.execute_script("return sessionStorage.getItem('quipu.key')") is None
    assert browser.find_element(By.ID, "signin").is_displayed()


def test_a_bad_key_is_refused_on_the_page(gw, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(gw.base + "/account")
    browser.find_element(By.ID, "key").send_keys("sk-qp-not-a-key")
    browser.find_element(By.ID, "signin-button").click()
    WebDriverWait(browser, 10).until(lambda d: "refused" in d.find_element(By.ID, "signin-error").text)
    assert browser.execute_script("return sessionStorage.getItem('quipu.key')") is None
    assert not browser.find_element(By.ID, "account").is_displayed()
