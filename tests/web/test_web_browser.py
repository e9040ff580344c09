#!/usr/bin/env python3
"""The page at `/` (docs/web.md) in a real browser: headless Chromium from
Debian driven by chromedriver through Selenium, against `cairn serve` on the
real instruct model (CAIRN_CHAT_MODEL) with a token and --cache-dir.

It loads `/`, is asked for the token, sends a chat turn and sees the reply
stream in, sees the second turn's cached-token figure (by tier), reloads and
continues the same conversation (a named cairn session), stops a reply with
the Stop button, opens the Cache view and sees the tiers and the plot update
as another turn is served, restarts the server on the same port with the
same --cache-dir and continues the conversation from the disk tier, checks
the Markdown renderer, that the page's JavaScript logged no error, and that
a wrong token gets the API's own 401. Screenshots go to $CAIRN_WEB_ARTIFACTS
(default: web-artifacts/ in the working directory) and, with
CAIRN_WEB_DOCS=1, into docs/ for the README.

Skips (exit 77, saying why) when Chromium, chromedriver or Selenium cannot be
found (scripts/setup.sh --test installs them) or the model is absent.

usage: test_web_browser.py CAIRN_BIN [unittest args...]
"""
import json
import os
import re
import shutil
import socket
import sys
import time
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import SHORT_HANG_GUARD_S, Server  # noqa: E402

[CAIRN] = harness.take_argv("CAIRN_BIN", usage=__doc__)
CHAT_MODEL = os.environ.get("CAIRN_CHAT_MODEL", "")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


def skip(why):
    print("skipped: " + why)
    sys.exit(77)


if not os.path.exists(CHAT_MODEL):
    skip(f"CAIRN_CHAT_MODEL ({CHAT_MODEL or 'unset'}) is absent; scripts/get-model fetches it")
if not CHROMIUM or not DRIVER:
    skip("Chromium and chromedriver are not installed (apt-get install chromium "
         "chromium-driver; scripts/setup.sh --test does it)")
try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:
    skip("the selenium Python package is missing (pip install selenium, or Debian's "
         "python3-selenium; scripts/setup.sh --test installs it)")

TOKEN = "web-test-token-0123456789"
ARTIFACTS = os.path.abspath(os.environ.get("CAIRN_WEB_ARTIFACTS", "web-artifacts"))
DOCS = os.path.join(harness.ROOT, "docs")
WAIT_S = SHORT_HANG_GUARD_S


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url, token=None, body=None, headers=None):
    h = dict(headers or {})
    if token is not None:
        h["Authorization"] = "Bearer " + token
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        h["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=WAIT_S) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class Page(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.scratch = cls.class_scratch = harness.Scratch("cairn-web-", graceful=True)
        cls.addClassCleanup(cls.scratch.close)
        cls.port = free_port()
        cls.args = ["-m", CHAT_MODEL, "--kv-mem", "128M", "--model-name", "qwen",
                    "--cache-dir", cls.scratch.path("cache"), "--auth-token", TOKEN,
                    "--http-port", str(cls.port)]
        cls.server = cls.scratch.start(CAIRN, cls.args, start_timeout=WAIT_S)
        cls.url = "http://127.0.0.1:%d" % cls.port
        os.makedirs(ARTIFACTS, exist_ok=True)
        opts = webdriver.ChromeOptions()
        opts.binary_location = CHROMIUM
        for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,860",
                  "--disable-dev-shm-usage", "--no-first-run", "--disable-extensions",
                  "--user-data-dir=" + cls.scratch.path("chromium")):
            opts.add_argument(a)
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        cls.driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=opts)
        cls.addClassCleanup(cls.driver.quit)
        cls.driver.set_page_load_timeout(WAIT_S)

    # ---- helpers ----------------------------------------------------------
    def wait(self, cond, what, timeout=WAIT_S):
        return WebDriverWait(self.driver, timeout, poll_frequency=0.1).until(
            lambda d: cond(d), message="waiting for " + what)

    def el(self, css):
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def els(self, css):
        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def shot(self, name, docs=False):
        path = os.path.join(ARTIFACTS, name)
        self.driver.save_screenshot(path)
        if docs and os.environ.get("CAIRN_WEB_DOCS") == "1":
            shutil.copy(path, os.path.join(DOCS, name))
        print("screenshot:", path)

    def console_errors(self):
        return [e for e in self.driver.get_log("browser") if e["level"] == "SEVERE"]

    def send(self, text, wait_done=True):
        n = len(self.els(".msg.assistant"))
        box = self.el("#prompt")
        box.clear()
        box.send_keys(text)
        self.el("#send").click()
        self.wait(lambda d: len(self.els(".msg.assistant")) == n + 1, "the reply's bubble")
        if wait_done:
            return self.wait_reply()
        return None

    def wait_reply(self):
        self.wait(lambda d: self.el("#send").is_enabled() and not self.els(".msg.streaming"),
                  "the reply to end")
        last = self.els(".msg.assistant")[-1]
        return last, last.find_element(By.CSS_SELECTOR, ".stats")

    # ---- the run ------------------------------------------------------------
    def test_page(self):
        d = self.driver
        d.get(self.url + "/")
        self.wait(lambda _: self.el("#token-view").is_displayed(), "the token form")
        self.shot("web-token.png")
        self.el("#token").send_keys(TOKEN)
        self.el("#token-save").click()
        self.wait(lambda _: self.el("#chat-view").is_displayed(), "the chat view")
        self.assertEqual(self.el("#model").text, "qwen")

        # settings: deterministic and short
        sysbox = self.el("#system")
        sysbox.clear()
        sysbox.send_keys("You are a concise coding assistant. Answer with code when useful.")
        for css, v in (("#temperature", "0"), ("#max-tokens", "60"), ("#seed", "7")):
            e = self.el(css)
            e.clear()
            e.send_keys(v)

        # turn 1: the reply streams (seen while the bubble is still open)
        self.send("Write a Python function that adds two numbers.", wait_done=False)
        self.wait(lambda _: self.els(".msg.streaming .body") and
                  self.els(".msg.streaming .body")[0].text.strip(), "streamed text", )
        streamed_early = self.els(".msg.streaming")
        msg, stats = self.wait_reply()
        self.assertTrue(streamed_early, "the reply was never seen while streaming")
        self.assertTrue(msg.find_element(By.CSS_SELECTOR, ".body").text.strip())
        self.assertIn("TTFT", stats.text)
        self.assertIn("prompt", stats.text)

        # turn 2: most of the prompt is the session's history, cached in the device tier
        msg, stats = self.send("Now make it multiply instead.")
        cached = int(stats.get_attribute("data-cached"))
        prompt = int(stats.get_attribute("data-prompt"))
        self.assertGreater(cached, prompt // 2, stats.text)
        self.assertIn("device", stats.text)
        self.shot("web-chat.png", docs=True)

        # Markdown and code blocks are shown as such
        body = d.execute_script(
            "const f = cairnMarkdown.render('# Title\\n\\nSome **bold** and `code`.\\n\\n"
            "```python\\ndef f():\\n    return 1\\n```\\n- a\\n- b\\n\\n<script>x</script>');"
            "const div = document.createElement('div'); div.appendChild(f);"
            "return [div.querySelector('h3') && div.querySelector('h3').textContent,"
            " div.querySelector('strong').textContent, div.querySelector('p code').textContent,"
            " div.querySelector('pre code').textContent, div.querySelector('pre code').dataset.lang,"
            " div.querySelectorAll('li').length, div.querySelectorAll('script').length];")
        self.assertEqual(body, ["Title", "bold", "code", "def f():\n    return 1", "python", 2, 0])
        replies = " ".join(e.text for e in self.els(".msg.assistant .body"))
        if "def " in replies:  # the model wrote code: it is in a code block
            self.assertTrue(self.els(".msg.assistant pre.code"), replies)

        # reload: the conversation is listed and continues the same session
        conv_id = self.el("#conv-list li.active").get_attribute("data-id")
        d.refresh()
        self.wait(lambda _: self.el("#chat-view").is_displayed(), "the chat view after reload")
        self.assertEqual(len(self.els(".msg.user")), 2)
        self.assertEqual(self.el("#conv-list li.active").get_attribute("data-id"), conv_id)
        msg, stats = self.send("Add a docstring.")
        self.assertGreater(int(stats.get_attribute("data-cached")),
                           int(stats.get_attribute("data-prompt")) // 2, stats.text)

        # the Stop button ends a reply
        mt = self.el("#max-tokens")
        mt.clear()
        mt.send_keys("400")
        # (the UI samples at temperature 0.7: a reply may end by itself before
        # the click lands, in a few tokens; then it is asked again. A Stop
        # that does nothing lets the reply run to its 400 tokens: a failure.)
        for attempt in range(3):
            self.send("Explain in detail how Python decorators work, with examples.",
                      wait_done=False)
            self.wait(lambda _: self.els(".msg.streaming .body") and
                      self.els(".msg.streaming .body")[0].text.strip(), "the long reply to start")
            self.el("#stop").click()
            msg, stats = self.wait_reply()
            out = re.search(r"([0-9,]+) tok out", stats.text)
            out = int(out.group(1).replace(",", "")) if out else 0
            if "stopped" in stats.text or out >= 400:
                break
        self.assertIn("stopped", stats.text)
        mt.clear()
        mt.send_keys("40")

        # the Cache view: tiers, the plot, the session; it updates live
        self.el("#tab-cache").click()
        self.wait(lambda _: self.els("#tiers .tier.device") and
                  int(self.el("#tiers .tier.device").get_attribute("data-pages")) > 0,
                  "the device tier's pages")
        self.wait(lambda _: self.els("#sessions tr[data-name='%s']" % conv_id),
                  "the conversation's session in the list")
        total = int(self.el("#chart").get_attribute("data-total"))
        hits = int(self.el("#tiers .tier.device").get_attribute("data-hits"))
        self.assertGreater(total, 0)
        # another turn of the same conversation, sent beside the page
        msgs = [{"role": "system", "content": "You are a concise coding assistant."},
                {"role": "user", "content": "Say hello in one short sentence."}]
        for _ in range(2):
            status, _b = http(self.url + "/v1/chat/completions", TOKEN,
                              {"model": "qwen", "messages": msgs, "max_tokens": 8,
                               "session_id": "beside-the-page"})
            self.assertEqual(status, 200)
        self.wait(lambda _: int(self.el("#chart").get_attribute("data-total")) > total and
                  int(self.el("#tiers .tier.device").get_attribute("data-hits")) > hits,
                  "the plot and the device tier to show the new turns")
        self.wait(lambda _: self.els("#sessions tr[data-name='beside-the-page']"),
                  "the new session in the list")
        self.wait(lambda _: "…" not in self.el("#prefixes tbody").text and
                  self.el("#prefixes tbody td").text.strip(), "the reused prefixes")
        self.shot("web-cache.png", docs=True)

        # no JavaScript error so far
        self.assertEqual(self.console_errors(), [])

        # a restart with the same --cache-dir: the conversation continues
        # from the cache (its pages come back from disk)
        self.el("#tab-chat").click()
        self.server.stop()
        self.server = self.scratch.start(CAIRN, self.args, start_timeout=WAIT_S)
        d.refresh()
        self.wait(lambda _: self.el("#chat-view").is_displayed(), "the chat view after restart")
        self.assertEqual(self.el("#conv-list li.active").get_attribute("data-id"), conv_id)
        msg, stats = self.send("Thanks. Summarise in one line.")
        cached = int(stats.get_attribute("data-cached"))
        self.assertGreater(cached, 0, stats.text)
        self.assertTrue("disk" in stats.text or "host" in stats.text, stats.text)
        self.shot("web-chat-after-restart.png")
        self.assertEqual(self.console_errors(), [])

        # a wrong token: the page shows the API's own 401
        api_status, api_body = http(self.url + "/v1/chat/completions", "wrong-token-000000",
                                    {"messages": msgs})
        state_status, state_body = http(self.url + "/web/state", "wrong-token-000000")
        self.assertEqual((api_status, state_status), (401, 401))
        self.assertEqual(json.loads(api_body), json.loads(state_body))
        self.el("#token-change").click()
        tok = self.el("#token")
        tok.clear()
        tok.send_keys("wrong-token-000000")
        self.el("#token-save").click()
        self.wait(lambda _: self.el("#token-error").text, "the token error")
        self.assertEqual(self.el("#token-error").get_attribute("data-status"), "401")
        self.assertEqual(self.el("#token-error").text,
                         "401 " + json.loads(api_body)["error"]["message"])
        self.shot("web-wrong-token.png")
        # the only console lines now are the browser's own for the 401 answer
        for e in self.console_errors():
            self.assertIn("401", e["message"], e)


if __name__ == "__main__":
    harness.main()
