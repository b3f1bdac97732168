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


def start_browser(workdir, lang: str | None = None):
    """A headless Chromium; `lang` is the language the browser prefers (`es-PE`)."""
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
    if lang:
        opts.add_argument(f"--lang={lang}")
        opts.add_argument(f"--accept-lang={lang}")
        opts.add_experimental_option("prefs", {"intl.accept_languages": f"{lang},{lang.split('-')[0]}"})
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=DRIVER, log_output=str(pathlib.Path(workdir) / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=opts)
    driver.set_page_load_timeout(30)
    return driver, profile


@pytest.fixture
def browser(workdir):
    driver, profile = start_browser(workdir, "en-US")
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


# --- Languages, the tenant's time zone, tiny amounts, caps and the manage actions ---------

LIMA = "America/Lima"


def soles_text(exact: str) -> str:
    """What the page shows for an exact amount: céntimos rounded half up, and below S/ 0.01
    three significant digits (the page's rule, computed here independently)."""
    d = Decimal(exact)
    sign = "-" if d < 0 else ""
    d = abs(d)
    if d == 0 or d >= Decimal("0.01"):
        return f"{sign}S/ {d.quantize(Decimal('0.01'), rounding='ROUND_HALF_UP'):,.2f}"
    first = -d.adjusted()  # the decimal place of the first significant digit
    q = d.quantize(Decimal(10) ** -min(12, first + 2), rounding="ROUND_HALF_UP")
    text = format(q, "f").rstrip("0")
    return f"{sign}S/ {text if len(text.split('.')[1]) >= 2 else text + '0'}"


def ledger_of_key(gw, key_id: str) -> Decimal:
    con = sqlite3.connect(f"file:{gw.store_url.removeprefix('sqlite://')}?mode=ro", uri=True)
    (s,) = con.execute("SELECT COALESCE(SUM(-delta), 0) FROM ledger WHERE key_id = ? AND kind = 'request'",
                       (key_id,)).fetchone()
    con.close()
    return Decimal(s) * Decimal(10) ** -12


def lima_clock(at: str) -> str:
    from datetime import datetime
    from zoneinfo import ZoneInfo

    t = datetime.fromisoformat(at.replace("Z", "+00:00")).astimezone(ZoneInfo(LIMA))
    return t.strftime("%H:%M")


@pytest.fixture
def capped(gw):
    """A tenant whose managing key may use colibri and spend S/ 5.00 a day, with three small
    requests on it (a few millionths of a sol each): (name, secret, key id)."""
    name = f"pagecap{next(_page_names)}"
    gw.cli("tenant", "create", name)
    gw.cli("topup", "--tenant", name, "--amount", "100.00")
    k = gw.cli("key", "create", "--tenant", name, "--label", "equipo", "--manage", "--models", "colibri",
               "--budget", "5.00", "--budget-period", "day")
    gw.wait_key(k["secret"])
    for i in range(3):
        status, body, _ = http_json(
            "POST", gw.base + "/v1/chat/completions",
            {"model": "colibri", "messages": [{"role": "user", "content": f"hola {i} [[sim: tokens=3]]"}]},
            {"Authorization": f"Bearer {k['secret']}"},
        )
        assert status == 200, body
    wait_until(lambda: in_flight_is_empty(gw, k["secret"]), 10, "the charges to reach the ledger")
    return name, k["secret"], k["key_id"]


_page_names = iter(range(1, 1000))


def sign_in(browser, gw, secret: str):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 15, ignored_exceptions=[StaleElementReferenceException])
    browser.get(gw.base + "/account")
    browser.find_element(By.ID, "key").send_keys(secret)
    browser.find_element(By.ID, "signin-button").click()
    wait.until(lambda d: d.find_element(By.ID, "balance").text.startswith("S/ ")
               and d.find_elements(By.CSS_SELECTOR, "#keys tbody tr"))
    return wait


def key_row(browser, key_id: str):
    from selenium.webdriver.common.by import By

    return browser.find_element(By.CSS_SELECTOR, f'#keys tbody tr[data-id="{key_id}"]')


def cells(row) -> list[str]:
    from selenium.webdriver.common.by import By

    return [c.text for c in row.find_elements(By.TAG_NAME, "td")]


def test_spanish_by_the_browser_english_by_the_switch(gw, workdir, capped):
    """Artifacts: account-es.png and account-en.png."""
    from selenium.webdriver.common.by import By

    name, secret, key_id = capped
    driver, profile = start_browser(workdir, "es-PE")
    try:
        assert driver.execute_script("return navigator.language").lower().startswith("es")
        driver.get(gw.base + "/account")
        assert driver.find_element(By.CSS_SELECTOR, "#signin h2").text == "Tu cuenta"
        assert driver.find_element(By.ID, "signin-button").text == "Ingresar"
        sign_in(driver, gw, secret)
        assert driver.execute_script("return document.documentElement.lang") == "es-PE"
        assert driver.find_element(By.CSS_SELECTOR, ".card h2").text == "Saldo"
        heads = [th.text for th in driver.find_elements(By.CSS_SELECTOR, "#keys thead th")]
        assert heads[:6] == ["Clave", "Etiqueta", "Modelos", "Tope", "Gastado en el periodo", "Disponible"], heads
        assert "Acciones" in heads, "a managing key sees the actions"

        # Every word has both languages, and every marked element shows the Spanish one.
        missing = driver.execute_script(
            "const en = Object.keys(MESSAGES.en), es = Object.keys(MESSAGES.es);"
            "return en.filter((k) => !es.includes(k)).concat(es.filter((k) => !en.includes(k)));")
        assert missing == [], missing
        untranslated = driver.execute_script(
            "return [...document.querySelectorAll('[data-i18n]')]"
            ".filter((e) => e.textContent !== MESSAGES.es[e.dataset.i18n]).map((e) => e.dataset.i18n);")
        assert untranslated == [], untranslated
        # The page's money rule, on amounts the API could send.
        for exact in ["0.000347", "0.00000000105", "0.0099999", "0.005", "1234.565", "-0.004",
                      "0.00", "12.5", "1000000.00"]:
            assert driver.execute_script("return soles(arguments[0])", exact) == soles_text(exact), exact

        # Its cap, what it spent today (Lima's day) and what is left, to the pico-sol.
        spent = ledger_of_key(gw, key_id)
        assert Decimal(0) < spent < Decimal("0.01"), spent
        row = key_row(driver, key_id)
        c = cells(row)
        assert c[1].startswith("equipo") and c[2] == "colibri" and c[3] == "S/ 5.00 al día", c
        spent_el = row.find_elements(By.CSS_SELECTOR, "td.num span.money")[0]
        assert Decimal(spent_el.get_attribute("data-exact")) == spent
        # A tiny amount shows the digits that make it non-zero, never S/ 0.00.
        assert spent_el.text == soles_text(str(spent)) and spent_el.text != "S/ 0.00", spent_el.text
        assert any(ch in "123456789" for ch in spent_el.text), spent_el.text
        remaining = row.find_elements(By.CSS_SELECTOR, "td.num span.money")[1]
        assert Decimal(remaining.get_attribute("data-exact")) == Decimal("5.00") - spent
        today = driver.find_element(By.ID, "spend-today")
        assert today.text == soles_text(today.get_attribute("data-exact")) and today.text != "S/ 0.00"

        # Times in Lima: each request's time is its instant on a Lima clock.
        first = driver.find_element(By.CSS_SELECTOR, "#requests tbody td[data-at]")
        assert lima_clock(first.get_attribute("data-at")) in first.text, first.text
        assert LIMA in driver.find_element(By.ID, "as-of").text
        ARTIFACTS.mkdir(exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "account-es.png"))

        # The switch: English, remembered across a reload.
        switch = driver.find_element(By.ID, "lang")
        assert switch.text == "English"
        switch.click()
        assert driver.find_element(By.CSS_SELECTOR, ".card h2").text == "Balance"
        assert driver.execute_script("return localStorage.getItem('quipu.lang')") == "en"
        assert cells(key_row(driver, key_id))[3] == "S/ 5.00 a day"
        assert "Spent this period" in [th.text for th in driver.find_elements(By.CSS_SELECTOR, "#keys thead th")]
        driver.refresh()
        sign_wait = driver.find_element(By.ID, "lang")
        assert sign_wait.text == "Español"
        from selenium.webdriver.support.ui import WebDriverWait
        WebDriverWait(driver, 15).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#keys tbody tr"))
        assert driver.find_element(By.CSS_SELECTOR, ".card h2").text == "Balance"
        assert driver.execute_script("return document.documentElement.lang") == "en-US"
        driver.save_screenshot(str(ARTIFACTS / "account-en.png"))
        logs = [e for e in driver.get_log("browser")
                if e["level"] in ("SEVERE", "WARNING") and "favicon.ico" not in e["message"]]
        assert not logs, json.dumps(logs, indent=1)
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def test_a_manage_key_creates_limits_and_revokes_a_key_on_the_page(gw, browser, capped):
    """Artifact: account-manage.png."""
    from selenium.webdriver.common.by import By

    name, secret, manager_id = capped
    wait = sign_in(browser, gw, secret)
    assert browser.find_element(By.CSS_SELECTOR, ".card h2").text == "Balance", "English by the browser"
    form = browser.find_element(By.ID, "key-form")
    assert form.is_displayed()
    # The managing key's own row offers nothing: keys with the manage scope are the operator's.
    assert key_row(browser, manager_id).find_elements(By.CSS_SELECTOR, "button") == []

    browser.find_element(By.ID, "kf-label").send_keys("from the page")
    browser.find_element(By.ID, "kf-models").send_keys("colibri")
    browser.find_element(By.ID, "kf-amount").send_keys("1.00")
    browser.execute_script("arguments[0].value = '2099-01-31'", browser.find_element(By.ID, "kf-expires"))
    browser.find_element(By.ID, "kf-submit").click()
    wait.until(lambda d: d.find_element(By.ID, "new-secret").is_displayed())
    new_secret = browser.find_element(By.ID, "new-secret-value").text
    assert new_secret.startswith("sk-qp-")
    status, listing, _ = http_json("GET", gw.base + "/v1/keys?limit=100", headers={"Authorization": f"Bearer {secret}"})
    made = next(k for k in listing["data"] if k["label"] == "from the page")
    # Midnight of the chosen day in Lima.
    assert made["rules"]["expires_at"] == "2099-01-31T05:00:00Z", made["rules"]
    assert made["rules"]["models"] == ["colibri"] and made["cap"]["amount"]["exact"] == "1.00"
    wait.until(lambda d: cells(key_row(d, made["id"]))[3] == "S/ 1.00 a day")
    status, body, _ = http_json("POST", gw.base + "/v1/chat/completions",
                                {"model": "colibri", "messages": [{"role": "user", "content": "hola"}]},
                                {"Authorization": f"Bearer {new_secret}"})
    assert status == 200, body
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "account-manage.png"))
    browser.find_element(By.ID, "new-secret-done").click()
    assert not browser.find_element(By.ID, "new-secret").is_displayed()

    # Limit it: a smaller cap.
    key_row(browser, made["id"]).find_element(By.CSS_SELECTOR, "button.limit").click()
    amount = browser.find_element(By.ID, "kf-amount")
    assert amount.get_attribute("value") == "1.00"
    amount.clear()
    amount.send_keys("0.50")
    browser.find_element(By.ID, "kf-submit").click()
    wait.until(lambda d: cells(key_row(d, made["id"]))[3] == "S/ 0.50 a day")

    # Beyond the managing key's cap: refused, the reason shown.
    browser.find_element(By.ID, "kf-models").send_keys("colibri")
    browser.find_element(By.ID, "kf-amount").send_keys("9.00")
    browser.find_element(By.ID, "kf-submit").click()
    wait.until(lambda d: "managing key's cap" in d.find_element(By.ID, "keys-error").text)

    # Revoke: two clicks, then the secret is refused.
    revoke = key_row(browser, made["id"]).find_element(By.CSS_SELECTOR, "button.revoke")
    revoke.click()
    assert revoke.text == "Revoke for good?"
    revoke.click()
    wait.until(lambda d: "revoked" in cells(key_row(d, made["id"]))[9])

    def refused():
        s, _, _ = http_json("POST", gw.base + "/v1/chat/completions",
                            {"model": "colibri", "messages": [{"role": "user", "content": "hola"}]},
                            {"Authorization": f"Bearer {new_secret}"})
        return s == 401

    wait_until(refused, 5, "the revoked key to be refused")
