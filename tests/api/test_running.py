"""The running API (its own process, the session's broker): the OpenAPI document it serves,
schemathesis against it (no 5xx, every answer as documented), and the support page in a real
browser: Debian's chromium, headless, driven by Selenium through chromium-driver."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest

from api.scopes import Scope
from operators.records import Category, Channel
from senders.policy.transitions import OutcomePlan
from senders.runtime.pool import open_status_store
from senders.statuses import DeliveryStatus, Lane
from settings import REPO_ROOT
from tests.api.conftest import ALL_SCOPES, RunningApi, signed
from tests.senders.conftest import register_users

pytestmark = pytest.mark.integration


def test_the_served_openapi_document_is_the_committed_one(running_api: RunningApi) -> None:
    with running_api.client(None) as c:
        served = c.get("/openapi.json").json()
    assert served == json.loads((REPO_ROOT / "docs" / "openapi.json").read_text(encoding="utf-8"))


def test_schemathesis_finds_no_server_error_and_no_answer_outside_the_document(running_api: RunningApi) -> None:
    """Every route, with inputs from the document (examples, the coverage phase's edges and
    invalid values, fuzzing) and, in the stateful phase, chains that follow the document's links
    (a notification written, then read; a profile written, read, listed, erased; a campaign
    created, read, paused, resumed): no answer is a 5xx, and every answer is as documented. A
    caller with every scope, so the routes' own checks are what is reached."""
    register_users(running_api.cfg, ["nusrat", "bruno"])
    token = running_api.token("fuzz", categories=(Category.TRANSACTIONAL, Category.MARKETING), scopes=ALL_SCOPES,
                              rate=1000)
    run = subprocess.run(
        [str(REPO_ROOT / ".venv" / "bin" / "schemathesis") if (REPO_ROOT / ".venv").exists()
         else shutil.which("schemathesis") or "schemathesis",
         "run", f"{running_api.url}/openapi.json",
         "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,"
                     "response_headers_conformance,response_schema_conformance",
         "--max-examples", "15", "--seed", "15", "--request-timeout", "20",
         "--phases", "examples,coverage,fuzzing,stateful",
         "-H", f"Authorization: Bearer {token}"],
        capture_output=True, text=True, timeout=600, cwd=REPO_ROOT,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "Stateful" in run.stdout and "links" in run.stdout.lower(), run.stdout[-3000:]


# -- the support page ------------------------------------------------------------------------------


def _seed(api: RunningApi) -> tuple[str, str]:
    """A notification through the API, and what the senders would have recorded for it: sent,
    then delivered by a signed receipt."""
    register_users(api.cfg, ["amina"], [Channel.SMS, Channel.PUSH])
    token = api.token("support-shop", scopes=(Scope.SEND, Scope.SUPPORT_READ))
    with api.client(token) as c:
        reply = c.post("/v1/notifications", headers={"Idempotency-Key": "evt-support-1"}, json={
            "user_id": "amina", "template": "order_shipped", "params": {"order": "A-1"}, "channels": ["sms", "push"]})
        assert reply.status_code == 202, reply.text
        nid = reply.json()["id"]
    store = open_status_store(api.cfg)
    try:
        for channel in (Channel.SMS, Channel.PUSH):
            key = f"support-shop/evt-support-1:{channel.value}:1796115600000"
            store.claim(message_key=key, notification_id=nid, channel=channel, lane=Lane.NORMAL, attempt=1,
                        now_ms=int(time.time() * 1000), lease_ms=60_000, owner="w", user_id="amina")
        store.finish(message_key="support-shop/evt-support-1:sms:1796115600000", attempt=1, owner="w",
                     plan=OutcomePlan(DeliveryStatus.SENT), provider="127.0.0.1", error=None,
                     now_ms=int(time.time() * 1000), provider_ref="ref-support-1")
    finally:
        store.close()
    raw, headers = signed({"message_id": "ref-support-1", "status": "delivered"})
    with api.client(None) as c:
        assert c.post("/webhooks/127.0.0.1", content=raw, headers=headers).status_code == 200
    return nid, token


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        pytest.fail("chromium and chromium-driver are needed (make system-packages installs them)")
    profile = tempfile.mkdtemp(prefix="support-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-dev-shm-usage",
                f"--user-data-dir={profile}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def test_the_support_page_finds_a_notification_by_id_dedup_key_and_user(
    running_api: RunningApi, browser: object
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver: WebDriver = browser  # type: ignore[assignment]
    nid, token = _seed(running_api)
    driver.get(f"{running_api.url}/support")
    wait = WebDriverWait(driver, 20)

    def search(query: str) -> None:
        box = driver.find_element(By.ID, "query")
        box.clear()
        box.send_keys(query)
        driver.find_element(By.ID, "search").click()

    def channel_cells(channel: str) -> list[str]:
        row = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, f"#channels tr[data-channel={channel}]")))
        return [td.text for td in row.find_elements(By.TAG_NAME, "td")]

    driver.find_element(By.ID, "token").send_keys("ndk_wrong")
    search(nid)
    wait.until(ec.text_to_be_present_in_element((By.ID, "error"), "the token is not valid"))
    token_box = driver.find_element(By.ID, "token")
    token_box.clear()
    token_box.send_keys(token)

    for query in (nid, "support-shop/evt-support-1"):  # support looks up the full dedup key
        search(query)
        wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, "h2 .nid"), nid))
        assert driver.find_element(By.CSS_SELECTOR, "h2 .verdict").text == "ACCEPTED"
        sms = channel_cells("sms")
        assert sms[:5] == ["sms", "delivered", "", "1", "127.0.0.1"]
        assert sms[7].startswith("delivered at ")
        assert channel_cells("push")[:4] == ["push", "sending", "", "1"]
        facts = driver.find_element(By.TAG_NAME, "dl").text
        assert "evt-support-1" in facts and "amina" in facts and "order_shipped" in facts
        assert "A-1" not in driver.page_source  # params are never shown

    search("amina")
    link = wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, "#notifications a.nid")))
    assert link.text == nid
    row = driver.find_element(By.CSS_SELECTOR, "#notifications tr:nth-child(2)").text
    assert "sms: delivered" in row and "push: sending" in row
    link.click()
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#channels tr[data-channel=sms]")))
    assert driver.find_element(By.CSS_SELECTOR, "h2 .nid").text == nid

    search("no-such-thing")
    wait.until(ec.text_to_be_present_in_element((By.ID, "error"), "nothing found for no-such-thing"))
    severe = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE" and "404" not in e.get("message", "")
              and "401" not in e.get("message", "")]
    assert severe == []


def test_the_api_stops_cleanly_on_sigterm(running_api: RunningApi) -> None:
    """Last in the module: SIGTERM drains requests in flight, stops the services (campaigns, the
    producer flushed, the store) and ends the process by that signal, as uvicorn does."""
    assert running_api.stop() in (0, -signal.SIGTERM)
    log = running_api.log.read_text()
    assert "the API is stopping" in log and "Application shutdown complete" in log
    assert "Traceback" not in log
