#!/usr/bin/env python3
"""Defects a new user met (issue 38), through the real `cairn serve`:
`/v1/completions` parses special-token text by default and honours
`parse_special` both ways while chat message content stays plain text; a
reply cut by max_tokens after a tool call finishes `length` (Anthropic:
`max_tokens`) with no partial call as content; a prompt that fits while
prompt + max_tokens does not is 400 `context_length_exceeded`, as is
`max_tokens: 0` a 400, while an omitted max_tokens still works; /tokenize
counts a conversation longer than the context; `--api-key` is the token
option; `--http-port` alone binds no msgpack port; a long prompt logs its
progress (tokens done, tokens/s, ETA) and a short one logs nothing.

usage: test_new_user.py CAIRN_BIN MODEL CLASS [unittest args...]
  CLASS (comma-separated) TinyModel and Progress run on MODEL (stories260K);
  ChatModel and PrefillProgress on CAIRN_CHAT_MODEL
  (skips, 77, when that file is absent).
"""
import json
import os
import sys
import urllib.error
import urllib.request
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import SHORT_HANG_GUARD_S, Server  # noqa: E402

CAIRN, MODEL, CLASS = harness.take_argv("CAIRN_BIN", "MODEL", "CLASS", usage=__doc__)
CHAT_MODEL = os.environ.get("CAIRN_CHAT_MODEL", "")
N_CTX = 256


def post(server, path, body, token=None):
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = "Bearer " + token
    req = urllib.request.Request(server.http_url + path, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(req, timeout=SHORT_HANG_GUARD_S) as f:
            return f.status, json.load(f)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


class TinyModel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server(CAIRN, ["-m", MODEL, "-c", str(N_CTX), "--kv-mem", "32M"], http=True,
                            start_timeout=SHORT_HANG_GUARD_S)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_max_tokens_beyond_the_context_is_400(self):
        prompt = "Once upon a time " * 20
        status, body = post(self.server, "/v1/completions", {"prompt": prompt, "max_tokens": 16})
        self.assertEqual(status, 200, body)
        n_prompt = body["usage"]["prompt_tokens"]
        self.assertLess(n_prompt, N_CTX)
        # fits alone, not with the completion: refused, never silently clipped
        for route, req in (("/v1/completions", {"prompt": prompt}),
                           ("/v1/chat/completions",
                            {"messages": [{"role": "user", "content": prompt}]})):
            req = dict(req, max_tokens=N_CTX - 5)
            status, body = post(self.server, route, req)
            self.assertEqual(status, 400, body)
            self.assertEqual(body["error"]["code"], "context_length_exceeded", body)
            self.assertEqual(body["error"]["param"], "max_tokens", body)
            self.assertIn(str(N_CTX), body["error"]["message"])
            # max_tokens 0 is no request either (OpenAI, vLLM: 400)
            status, body = post(self.server, route, dict(req, max_tokens=0))
            self.assertEqual(status, 400, body)
            self.assertEqual(body["error"]["param"], "max_tokens", body)
            # omitted: the default fills what the context leaves
            req.pop("max_tokens")
            status, body = post(self.server, route, dict(req, temperature=0))
            self.assertEqual(status, 200, body)
            self.assertLessEqual(body["usage"]["total_tokens"], N_CTX)
        # a fitting request still works, up to the last token of the context
        status, body = post(self.server, "/v1/completions",
                            {"prompt": prompt, "max_tokens": N_CTX - n_prompt, "ignore_eos": True})
        self.assertEqual(status, 200, body)

    def test_tokenize_longer_than_the_context(self):
        long = "Once upon a time there was a little dog. " * 60
        for body in ({"content": long}, {"messages": [{"role": "user", "content": long}]}):
            status, answer = post(self.server, "/tokenize", body)
            self.assertEqual(status, 200, answer)
            self.assertGreater(answer["count"], N_CTX)
            self.assertEqual(len(answer["tokens"]), answer["count"])

    def test_http_port_alone_binds_no_msgpack_port(self):
        # two servers side by side, each with one port flag
        one = Server(CAIRN, ["-m", MODEL, "-c", str(N_CTX), "--kv-mem", "16M"], tcp=False,
                     http=True, start_timeout=SHORT_HANG_GUARD_S)
        try:
            two = Server(CAIRN, ["-m", MODEL, "-c", str(N_CTX), "--kv-mem", "16M"], tcp=False,
                         http=True, start_timeout=SHORT_HANG_GUARD_S)
            try:
                for s in (one, two):
                    self.assertIsNone(s.listening.tcp, s.log())
                    status, body = post(s, "/v1/completions", {"prompt": "Once", "max_tokens": 2})
                    self.assertEqual(status, 200, body)
            finally:
                two.stop()
        finally:
            one.stop()

    def test_api_key_is_the_token_option(self):
        token = "a-token-of-twenty-chars"
        s = Server(CAIRN, ["-m", MODEL, "-c", str(N_CTX), "--kv-mem", "16M", "--api-key", token],
                   tcp=False, http=True, start_timeout=SHORT_HANG_GUARD_S)
        try:
            req = {"prompt": "Once", "max_tokens": 2}
            self.assertEqual(post(s, "/v1/completions", req)[0], 401)
            self.assertEqual(post(s, "/v1/completions", req, token)[0], 200)
        finally:
            s.stop()

    def test_get_model_marks_what_cairn_cannot_load(self):
        # get-model's list of loadable architectures is the loader's own
        # (model/model.c, ARCHES); every model it fetches today loads
        import re
        import subprocess
        script = os.path.join(harness.ROOT, "scripts", "get-model")
        with open(os.path.join(harness.ROOT, "model", "model.c")) as f:
            table = f.read().split("ARCHES[] = {", 1)[1].split("};", 1)[0]
        with open(script) as f:
            loadable = re.search(r"^LOADABLE = \((.*)\)$", f.read(), re.M).group(1)
        self.assertEqual(sorted(set(re.findall(r'\{"(\w+)", CAIRN_ROPE_', table))),
                         sorted(re.findall(r'"(\w+)"', loadable)))
        out = subprocess.run([sys.executable, script, "--list"], capture_output=True, text=True,
                             check=True).stdout
        heads = [line for line in out.splitlines() if line and not line.startswith(" ")]
        self.assertTrue(any(line.startswith("gemma3") for line in heads), out)
        for line in heads:
            self.assertNotIn("cannot load", line)

    def test_banner(self):
        log = self.server.log()
        lines = [line for line in log.splitlines() if line.startswith("cairn:")]
        i = next(i for i, line in enumerate(lines) if "listening" in line)
        url = self.server.http_url + "/"
        web = [k for k, line in enumerate(lines) if url in line and "listening" not in line]
        self.assertTrue(web and web[0] < i, log)  # the page's URL first
        banner = "\n".join(lines)
        for want in ("stories260K.gguf", "llama", "KV f16", "cpu", "device KV"):
            self.assertIn(want, banner)
        weights = next(line for line in lines if line.startswith("cairn: weights"))
        self.assertNotIn("stories", weights)  # a type, not general.name
        after = "\n".join(lines[i + 1:])
        self.assertIn("curl " + self.server.http_url + "/v1/", after)
        self.assertIn('OpenAI(base_url="%s/v1"' % self.server.http_url, after)


class Progress(unittest.TestCase):
    """`cairn perplexity` and `cairn bench` show progress on a terminal, and
    none when stderr is not one."""

    def run_cmd(self, args, tty):
        import pty
        import subprocess
        if not tty:
            r = subprocess.run([CAIRN] + args, capture_output=True, text=True,
                               timeout=SHORT_HANG_GUARD_S)
            self.assertEqual(r.returncode, 0, r.stderr)
            return r.stderr
        master, slave = pty.openpty()
        p = subprocess.Popen([CAIRN] + args, stdout=subprocess.DEVNULL, stderr=slave)
        os.close(slave)
        out = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        os.close(master)
        self.assertEqual(p.wait(timeout=SHORT_HANG_GUARD_S), 0, out)
        return out.decode(errors="replace")

    def test_perplexity(self):
        args = ["perplexity", "-m", MODEL, "-f", os.path.join(harness.TESTDATA, "text",
                                                              "stories.txt"),
                "-c", "64", "--chunks", "3"]
        self.assertIn("ETA", self.run_cmd(args, True))
        self.assertNotIn("ETA", self.run_cmd(args, False))

    def test_bench(self):
        args = ["bench", "-m", MODEL, "-p", "16", "-n", "8", "-r", "2"]
        self.assertIn("bench: tg 2/2", self.run_cmd(args, True))
        self.assertNotIn("bench: tg", self.run_cmd(args, False))


class PrefillProgress(unittest.TestCase):
    """`serve` logs a long prefill's progress: the first line once the prompt
    has been computing for --progress-ms, then at most that often, each with
    tokens done of the prompt, tokens/s and an ETA, and a last line with the
    total; a short prompt says nothing at the default (1 s)."""

    @classmethod
    def setUpClass(cls):
        if not os.path.exists(CHAT_MODEL):
            raise unittest.SkipTest("CAIRN_CHAT_MODEL (%s) is absent; scripts/get-model "
                                    "fetches it" % (CHAT_MODEL or "unset"))

    def start(self, *extra):
        server = Server(CAIRN, ["-m", CHAT_MODEL, "-c", "2048", "--kv-mem", "128M",
                                "--prefill-chunk", "32", *extra], http=True,
                        start_timeout=SHORT_HANG_GUARD_S)
        self.addCleanup(server.stop)
        return server

    def test_long_prompt_logs_progress(self):
        import re
        server = self.start("--progress-ms", "20")
        text = " ".join("line %d of a long document about harbours and ships." % i
                        for i in range(120))
        st, r = post(server, "/v1/completions", {"prompt": text, "max_tokens": 1})
        self.assertEqual(st, 200, r)
        n = r["usage"]["prompt_tokens"]
        self.assertGreater(n, 1000)
        log = server.log()
        steps = [(int(m.group(1)), int(m.group(2))) for m in re.finditer(
            r"prefill: client \d+ request \d+: (\d+) / (\d+) tokens \(\d+%\), \d+ tok/s, "
            r"ETA \d+ s", log)]
        # 32-token chunks of a 0.5B take well over 20 ms each on any CPU
        self.assertGreaterEqual(len(steps), 2, log)
        self.assertTrue(all(total == n for _, total in steps), log)
        done = [d for d, _ in steps]
        self.assertEqual(done, sorted(done), log)
        self.assertTrue(all(0 < d < n for d in done), log)
        self.assertRegex(log, r"prefill: client \d+ request \d+: %d tokens computed in "
                              r"[\d.]+ s \(\d+ tok/s, 0 cached\)" % n)

        # the same prompt again is cached: nothing to say
        before = log.count("prefill:")
        st, r = post(server, "/v1/completions", {"prompt": text, "max_tokens": 1})
        self.assertEqual(st, 200, r)
        self.assertEqual(server.log().count("prefill:"), before)

    def test_short_prompt_and_off_say_nothing(self):
        server = self.start()  # default: after a second
        st, r = post(server, "/v1/completions", {"prompt": "Hello there", "max_tokens": 1})
        self.assertEqual(st, 200, r)
        self.assertNotIn("prefill:", server.log())
        off = self.start("--progress-ms", "0")
        text = " ".join("item %d" % i for i in range(400))
        st, r = post(off, "/v1/completions", {"prompt": text, "max_tokens": 1})
        self.assertEqual(st, 200, r)
        self.assertNotIn("prefill:", off.log())


class ChatModel(unittest.TestCase):
    TOOLS = [{"type": "function", "function": {
        "name": "get_weather", "description": "weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]
    # no end of turn: after its call the model goes on and is cut mid-call
    NO_END = {"151645": -100, "151643": -100}

    @classmethod
    def setUpClass(cls):
        if not os.path.exists(CHAT_MODEL):
            raise unittest.SkipTest("CAIRN_CHAT_MODEL (%s) is absent; scripts/get-model "
                                    "fetches it" % (CHAT_MODEL or "unset"))
        cls.server = Server(CAIRN, ["-m", CHAT_MODEL, "-c", "1024", "--kv-mem", "128M"],
                            http=True, start_timeout=SHORT_HANG_GUARD_S)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_completions_parse_special(self):
        prompt = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        counts = {}
        for ps in (None, True, False):
            req = {"prompt": prompt, "max_tokens": 1}
            if ps is not None:
                req["parse_special"] = ps
            status, body = post(self.server, "/v1/completions", req)
            self.assertEqual(status, 200, body)
            counts[ps] = body["usage"]["prompt_tokens"]
        self.assertEqual(counts[None], 9)  # as vLLM and llama-server
        self.assertEqual(counts[True], 9)
        self.assertGreater(counts[False], 20)  # the markers spelled as text
        # a chat message's content is never parsed
        msgs = [{"role": "user", "content": prompt}]
        status, body = post(self.server, "/tokenize", {"messages": msgs})
        plain = post(self.server, "/tokenize",
                     {"messages": [{"role": "user", "content": "user\nhi\n\nassistant\n"}]})[1]
        self.assertGreater(body["count"], plain["count"] + 8)

    def test_cut_after_a_tool_call(self):
        msgs = [{"role": "user", "content": "What is the weather in Paris and in London?"}]
        for stream in (False, True):
            req = {"messages": msgs, "tools": self.TOOLS, "temperature": 0, "max_tokens": 45,
                   "logit_bias": self.NO_END, "stream": stream}
            if not stream:
                status, body = post(self.server, "/v1/chat/completions", req)
                self.assertEqual(status, 200, body)
                choice = body["choices"][0]
                self.assertEqual(choice["finish_reason"], "length", choice)
                self.assertEqual(len(choice["message"]["tool_calls"]), 1, choice)
                self.assertNotIn("get_weather", choice["message"]["content"] or "", choice)
                continue
            r = urllib.request.Request(self.server.http_url + "/v1/chat/completions",
                                       json.dumps(req).encode(),
                                       {"Content-Type": "application/json"})
            content, finish = "", None
            with urllib.request.urlopen(r, timeout=SHORT_HANG_GUARD_S) as f:
                for line in f:
                    line = line.decode().strip()
                    if not line.startswith("data: {"):
                        continue
                    for ch in json.loads(line[6:])["choices"]:
                        content += ch["delta"].get("content") or ""
                        finish = ch.get("finish_reason") or finish
            self.assertEqual(finish, "length")
            self.assertNotIn("get_weather", content)
        # Anthropic: stop_reason max_tokens, no partial call as a text block
        status, body = post(self.server, "/v1/messages", {
            "model": "m", "max_tokens": 45, "messages": msgs, "temperature": 0,
            "tools": [{"name": "get_weather", "description": "weather of a city",
                       "input_schema": self.TOOLS[0]["function"]["parameters"]}]})
        self.assertEqual(status, 200, body)
        self.assertIn(body["stop_reason"], ("max_tokens", "tool_use"), body)
        for block in body["content"]:
            if block["type"] == "text":
                self.assertNotIn("get_weather", block["text"], body)
        # a forced call cut short: nothing of it is content
        status, body = post(self.server, "/v1/chat/completions",
                            {"messages": msgs, "tools": self.TOOLS, "tool_choice": "required",
                             "max_tokens": 6, "temperature": 0})
        self.assertEqual(status, 200, body)
        choice = body["choices"][0]
        self.assertEqual(choice["finish_reason"], "length", choice)
        self.assertFalse(choice["message"]["content"], choice)


if __name__ == "__main__":
    harness.main(defaultTest=CLASS.split(","))
