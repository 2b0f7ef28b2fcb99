"""The demo in a real browser: server.sh + startup_visualize.sh, driven by headless Chromium.

Setup installs Debian's ``chromium`` and ``chromium-driver`` with apt-get when /usr/bin/chromium is
missing (CI runs as root), starts the retrieval service with ``startup/server.sh`` over the
embedded world and the page with ``startup/startup_visualize.sh --backend oracle`` (the world's
gold-decomposition policy: real retrieval, no model weights, seconds per question), both on free
ports on 127.0.0.1. The test types a dev question, waits for the final-answer card, checks the
answer, the retrieved passages, the raw view's masked spans, the download link and the settings
panel, and saves screenshots to tests/artifacts/ (a copy goes to docs/demo.png when that file is
missing or R3RAG_UPDATE_DEMO_SCREENSHOT=1).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from demo_helpers import alive, free_port, group_members, listening_addresses, server_sh

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
CHROME_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--window-size=1280,1750",
]

pytestmark = pytest.mark.slow


def ensure_chromium() -> None:
    if CHROMIUM.exists() and CHROMEDRIVER.exists():
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium", "chromium-driver"]):
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        if done.returncode != 0:
            pytest.fail(f"{' '.join(cmd)} failed (the browser test needs root and the Debian archive): {done.stderr[-500:]}")


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the page exited with {proc.returncode}: {log.read_text()[-2000:] if log else ''}")
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"{url} did not answer within {timeout:.0f} s")


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    """server.sh over the small embedded world; stopped (and checked by PID) afterwards."""
    run_dir = tmp_path_factory.mktemp("demo") / "run"
    port = free_port()
    started = server_sh("--run-dir", str(run_dir), "--retriever-port", str(port), "--world-size", "small")
    pid_file = run_dir / "pids" / "retriever.pid"
    pid = int(pid_file.read_text().split()[0]) if pid_file.exists() else None
    try:
        assert started.returncode == 0, started.stderr
        yield {"run_dir": run_dir, "url": f"http://127.0.0.1:{port}", "dataset": run_dir / "world-small-seed0" / "dev.jsonl"}
    finally:
        stopped = server_sh("--stop", "--run-dir", str(run_dir), timeout=60)
        if pid is not None:
            deadline = time.time() + 10
            while alive(pid) and time.time() < deadline:
                time.sleep(0.1)
            leftover = alive(pid)
            if leftover:
                os.killpg(pid, signal.SIGKILL)
            assert stopped.returncode == 0 and not leftover and group_members(pid) == []


def pick_question(services) -> tuple[str, str]:
    """A multi-hop dev question the oracle answers correctly through this retriever (checked in-process)."""
    from r3rag.config import load_config
    from r3rag.data.readers import read_questions
    from r3rag.demo.config import DemoConfig
    from r3rag.demo.policies import OraclePolicy, load_tokenizer
    from r3rag.demo.runner import DemoRunner, FinalEvent, RunSettings
    from r3rag.retrieval.client import RetrievalClient

    questions = read_questions(services["dataset"])
    cfg = load_config(DemoConfig, ROOT / "configs" / "demo.yaml")
    runner = DemoRunner(cfg, OraclePolicy(questions, load_tokenizer("tiny")), RetrievalClient(services["url"]), questions)

    async def first_correct() -> tuple[str, str]:
        for q in questions:
            if q.metadata.get("hops", 1) < 2:
                continue
            settings = RunSettings(cfg.rollout.format, cfg.rollout.max_steps, cfg.rollout.docs_per_step, 0.0)
            async for event in runner.stream(q.question, settings):
                if isinstance(event, FinalEvent) and event.scores and event.scores["em"] == 1.0:
                    return q.question, event.trajectory.answer or ""
        raise AssertionError("the oracle answered no multi-hop dev question correctly")

    return asyncio.run(first_correct())


@pytest.fixture(scope="module")
def page(services):
    """startup_visualize.sh with the oracle policy on a free port; killed (whole group) afterwards."""
    port = free_port()
    log = services["run_dir"] / "logs" / "page.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(
            ["bash", str(ROOT / "startup" / "startup_visualize.sh"), "--run-dir", str(services["run_dir"]),
             "--backend", "oracle", "--port", str(port)],
            cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", 180, proc, log)
        yield {"url": url, "port": port, "log": log}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.fixture(scope="module")
def browser():
    ensure_chromium()
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is a dev dependency of the demo test")
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="r3rag-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for flag in CHROME_FLAGS + [f"--user-data-dir={profile}"]:
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def test_question_answered_step_by_step_in_the_browser(services, page, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    question, gold = pick_question(services)
    assert listening_addresses(page["port"]) == {"127.0.0.1"}
    health = httpx.get(page["url"] + "/health", timeout=10).json()
    assert health["status"] == "ok" and health["retriever"] == [services["url"]] and health["questions"] > 0

    d = browser
    wait = WebDriverWait(d, 60)
    d.get(page["url"] + "/")
    box = wait.until(EC.element_to_be_clickable((By.CSS_SELECTOR, "#r3-question textarea")))
    assert d.find_elements(By.XPATH, "//*[contains(text(), 'Examples from the dataset')]")
    box.send_keys(question)
    d.find_element(By.CSS_SELECTOR, "#r3-ask").click()

    answer = wait.until(EC.visibility_of_element_located((By.CSS_SELECTOR, ".r3-final .r3-answer")))
    assert answer.text.strip() == gold
    final = d.find_element(By.CSS_SELECTOR, ".r3-final")
    assert "Gold answer" in final.text and gold in final.text
    steps = d.find_elements(By.CSS_SELECTOR, ".r3-step")
    assert len(steps) >= 3  # at least two queries and the answering step
    passages = d.find_elements(By.CSS_SELECTOR, ".r3-passage")
    assert passages and all(p.is_displayed() for p in passages)
    first = passages[0]
    title = first.find_element(By.CSS_SELECTOR, "summary b").text
    assert title and "score" in first.find_element(By.CSS_SELECTOR, "summary").text
    first.find_element(By.CSS_SELECTOR, "summary").click()  # expand the passage text
    wait.until(lambda _: first.find_element(By.CSS_SELECTOR, "div").is_displayed())
    assert first.find_element(By.CSS_SELECTOR, "div").text.strip()

    link = wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "#r3-download a")))
    saved = httpx.get(link.get_attribute("href"), timeout=10).json()
    assert saved["question"] == question and saved["answer"] == gold

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "demo_answer.png"
    d.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    docs_png = ROOT / "docs" / "demo.png"
    if not docs_png.exists() or os.environ.get("R3RAG_UPDATE_DEMO_SCREENSHOT") == "1":
        docs_png.parent.mkdir(exist_ok=True)
        shutil.copyfile(shot, docs_png)

    d.set_window_size(1280, 2400)  # room for the raw view below the cards
    d.find_element(By.XPATH, "//button[contains(., 'Raw text the model saw and wrote')]").click()
    marks = wait.until(lambda drv: [m for m in drv.find_elements(By.CSS_SELECTOR, "#r3-raw mark.r3-env") if m.is_displayed()])
    assert len(marks) >= 3 and "The retrieval documents:" in marks[1].text  # legend + one per documents block
    d.save_screenshot(str(ARTIFACTS / "demo_raw.png"))

    d.find_element(By.XPATH, "//button[@role='tab' and contains(., 'Settings')]").click()
    panel = wait.until(EC.visibility_of_element_located((By.CSS_SELECTOR, "#r3-settings")))
    wait.until(lambda _: "OK: retrieval service" in panel.text)
    assert "oracle" in panel.text
    d.save_screenshot(str(ARTIFACTS / "demo_settings.png"))


def test_empty_question_shows_a_message_in_the_browser(page, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    d = browser
    d.get(page["url"] + "/")
    WebDriverWait(d, 60).until(EC.element_to_be_clickable((By.CSS_SELECTOR, "#r3-ask"))).click()
    msg = WebDriverWait(d, 30).until(EC.visibility_of_element_located((By.CSS_SELECTOR, ".r3-msg-error")))
    assert "The question is empty" in msg.text
    assert not d.find_elements(By.CSS_SELECTOR, ".r3-final")
