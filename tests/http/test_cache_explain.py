#!/usr/bin/env python3
"""Why was my prompt recomputed (issue 36): every miss reason provoked through
a real client (openai, anthropic, the native cairn_client) against the real
`cairn serve` on the real instruct model, and read back from the answer's
usage (docs/why-recomputed.md):

- new_content:       a follow-up turn extending the history;
- history_rewritten: the same history with an assistant turn's <think> block
                     dropped (as a gateway or template would), placed inside
                     that turn;
- system_changed:    a nonce in the system prompt;
- tools_changed:     the same tools, reordered;
- evicted:           a document pushed out of a small --kv-mem (no host or
                     disk tier), then asked again: lost from the device;
- no_cache:          a fresh server, and a restart without --cache-dir;
- other_tenant_only: a document only another tenant (--tenants) sent;
- in_flight:         two requests over one long document at once: the second
                     waits for the first to compute it;
- /metrics counts the reasons; POST /v1/cache/explain (and `cairn cache
  explain`, which asks it) gives the run's answer without running it (prompt
  counters unchanged);
- the native protocol reports the same reason and position.

usage: test_cache_explain.py CAIRN_BIN [unittest args...]
  runs on CAIRN_CHAT_MODEL (skips, 77, when that file is absent)
"""
import concurrent.futures
import json
import os
import subprocess
import sys
import unittest
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import HANG_GUARD_S  # noqa: E402
from metrics import parse_metrics  # noqa: E402

(CAIRN,) = harness.take_argv("CAIRN_BIN", usage=__doc__)
CHAT_MODEL = os.environ.get("CAIRN_CHAT_MODEL", "")
PAGE = 16  # tokens per page (the default --page-size)

SYSTEM = ("You are the assistant of a storage team. Answer briefly and precisely, cite the "
          "section you rely on, and say so when the notes do not cover a question. ") * 3
USER1 = "Explain in one sentence what a radix tree over token pages is for."
THINK = ("<think>The user wants one sentence. A radix tree keyed by token pages lets "
         "requests that share a prefix find its cached KV pages again.</think>")
ANSWER1 = "It finds the cached KV pages of any prefix a new prompt shares with earlier ones."
USER2 = "And what happens to those pages when memory runs out?"
USER3 = "Which tier do they go to last?"

TOPICS = ["scheduler", "page pool", "radix tree", "disk tier", "tokenizer", "sampler",
          "HTTP facade", "session table", "cost model", "copy queue", "router", "grammar"]


def document(seed, n_paragraphs):
    """A deterministic text of about 40 tokens a paragraph, different per seed."""
    out = []
    for i in range(n_paragraphs):
        t = TOPICS[(i + seed) % len(TOPICS)]
        out.append("Note %d.%d: the %s of unit %d keeps %d entries and flushes them every %d "
                   "ms unless flag %s-%d is off." % (seed, i + 1, t, seed * 31 + i,
                                                    (i * 7 + seed) % 97, 10 + i + seed,
                                                    t.split()[0], i))
    return "\n".join(out)


def tool(name, what):
    return {"type": "function", "function": {
        "name": name, "description": what,
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                       "required": ["path"]}}}


TOOLS = [tool("read_file", "Read a file of the repository."),
         tool("list_dir", "List the entries of a directory."),
         tool("grep", "Search the repository for a pattern.")]


def post(srv, path, body, key=None):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    req = urllib.request.Request(srv.http_url + path, json.dumps(body).encode(), headers)
    with urllib.request.urlopen(req, timeout=HANG_GUARD_S) as f:
        return json.load(f)


def metrics(srv):
    with urllib.request.urlopen(srv.http_url + "/metrics", timeout=HANG_GUARD_S) as f:
        return parse_metrics(f.read().decode())[0]


def misses(srv):
    m = metrics(srv)
    return {k.split('"')[1]: v for k, v in m.items()
            if k.startswith("cairn_prompt_cache_misses_total{")}


def n_tokens(srv, messages, tools=None):
    """Tokens of a conversation rendered as /v1/chat/completions renders it
    (with the assistant cue)."""
    body = {"messages": messages}
    if tools:
        body["tools"] = tools
    return post(srv, "/tokenize", body)["count"]


class CacheExplain(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.path.exists(CHAT_MODEL):
            raise unittest.SkipTest("CAIRN_CHAT_MODEL (%s) is absent; scripts/get-model "
                                    "fetches it" % (CHAT_MODEL or "unset"))
        import openai  # noqa: F401  (installed by scripts/setup.sh --test)

    def start(self, scratch, *extra, kv="64M"):
        return scratch.start(CAIRN, ["-m", CHAT_MODEL, "-c", "2048", "--kv-mem", kv, *extra],
                             http=True)

    def openai(self, srv, key="unused"):
        import openai
        return openai.OpenAI(base_url=srv.http_url + "/v1", api_key=key, max_retries=0,
                             timeout=HANG_GUARD_S)

    def chat(self, client, messages, tools=None, max_tokens=2):
        kw = {"tools": tools} if tools else {}
        r = client.chat.completions.create(model="cairn", messages=messages,
                                           max_tokens=max_tokens, temperature=0, **kw)
        d = r.usage.prompt_tokens_details
        miss = d.model_extra.get("cache_miss")
        self.assertIsInstance(miss, dict, "usage.prompt_tokens_details.cache_miss is missing")
        return d.cached_tokens, miss, r

    def test_turns_new_content_and_history_rewritten(self):
        with harness.Scratch() as scratch:
            srv = self.start(scratch)
            client = self.openai(srv)
            sys_m = {"role": "system", "content": SYSTEM}
            u1 = {"role": "user", "content": USER1}
            with_think = {"role": "assistant", "content": THINK + ANSWER1}
            u2 = {"role": "user", "content": USER2}
            turn = [sys_m, u1, with_think, u2]

            cached, miss, _ = self.chat(client, turn)
            self.assertEqual(cached, 0)
            self.assertEqual(miss["reason"], "no_cache")
            self.assertEqual(miss["position"], 0)
            self.assertEqual(miss["cached_excerpt"], "")

            cached, miss, r = self.chat(client, turn, max_tokens=8)
            self.assertGreater(cached, 0)
            self.assertIsNone(miss["reason"], "a resent prompt is a hit: %s" % miss)

            # The next turn extends the history with the model's reply.
            follow = turn + [{"role": "assistant", "content": r.choices[0].message.content},
                             {"role": "user", "content": USER3}]
            cached, miss, _ = self.chat(client, follow)
            self.assertEqual(miss["reason"], "new_content", miss)
            self.assertGreaterEqual(cached, n_tokens(srv, turn) // PAGE * PAGE - PAGE)

            # The same history with the reasoning dropped from the assistant turn.
            rewritten = [sys_m, u1, {"role": "assistant", "content": ANSWER1}, u2]
            cached, miss, _ = self.chat(client, rewritten)
            self.assertEqual(miss["reason"], "history_rewritten", miss)
            turn_start = n_tokens(srv, [sys_m, u1])  # ends with the assistant cue
            turn_end = n_tokens(srv, [sys_m, u1, with_think])
            self.assertGreaterEqual(miss["position"], turn_start - 1, miss)
            self.assertLess(miss["position"], turn_end, miss)
            self.assertLessEqual(cached, miss["position"])  # nothing past the departure
            self.assertIn("<think>", miss["cached_excerpt"])
            self.assertNotIn("<think>", miss["prompt_excerpt"])

            counts = misses(srv)
            self.assertEqual(counts["no_cache"], 1)
            self.assertEqual(counts["new_content"], 1)
            self.assertEqual(counts["history_rewritten"], 1)

    def test_system_and_tools_changed_and_explain(self):
        with harness.Scratch() as scratch:
            srv = self.start(scratch)
            client = self.openai(srv)
            u1 = {"role": "user", "content": USER1}
            base = [{"role": "system", "content": SYSTEM}, u1]
            self.chat(client, base, tools=TOOLS)

            # A per-request nonce at the start of the system prompt.
            nonced = [{"role": "system", "content": "Request 7f3a9c. " + SYSTEM}, u1]
            cached, miss, _ = self.chat(client, nonced, tools=TOOLS)
            self.assertEqual(miss["reason"], "system_changed", miss)
            self.assertLess(miss["position"], n_tokens(srv, [nonced[0]]))
            self.assertLess(cached, PAGE)
            self.assertIn("7f3a9c", miss["prompt_excerpt"])
            self.assertNotIn("7f3a9c", miss["cached_excerpt"])

            # The same tools in another order.
            cached, miss, _ = self.chat(client, base, tools=TOOLS[::-1])
            self.assertEqual(miss["reason"], "tools_changed", miss)
            self.assertGreater(miss["position"], n_tokens(srv, base) // 4)
            self.assertIn("grep", miss["prompt_excerpt"])

            # Explain a third order without running it: nothing is computed or
            # counted, and the run that follows gives the same answer.
            rotated = TOOLS[1:] + TOOLS[:1]
            before = metrics(srv)
            body = {"model": "cairn", "messages": base, "tools": rotated, "max_tokens": 2}
            x = post(srv, "/v1/cache/explain", body)
            after = metrics(srv)
            for k in ("cairn_prompt_tokens_total", "cairn_requests_total",
                      "cairn_prefix_cache_hits_total", "cairn_generation_tokens_total"):
                self.assertEqual(after[k], before[k], k)
            self.assertEqual(after["cairn_prompt_cache_explains_total"],
                             before.get("cairn_prompt_cache_explains_total", 0) + 1)
            self.assertEqual(x["cache_miss"]["reason"], "tools_changed", x)
            self.assertEqual(x["prompt_tokens"], n_tokens(srv, base, rotated))
            # `cairn cache explain` asks the same endpoint
            body_file = scratch.path("body.json")
            with open(body_file, "w") as f:
                json.dump(body, f)
            out = subprocess.run([CAIRN, "cache", "explain", "--url", srv.http_url, "--json",
                                  body_file], capture_output=True, text=True,
                                 timeout=HANG_GUARD_S, check=True).stdout
            self.assertEqual(json.loads(out), x)
            out = subprocess.run([CAIRN, "cache", "explain", "--url", srv.http_url],
                                 input=json.dumps(body), capture_output=True, text=True,
                                 timeout=HANG_GUARD_S, check=True).stdout
            self.assertIn("tools_changed", out)
            self.assertIn("token %d" % x["cache_miss"]["position"], out)
            self.assertEqual(metrics(srv)["cairn_prompt_tokens_total"],
                             before["cairn_prompt_tokens_total"])
            cached, miss, _ = self.chat(client, base, tools=rotated)
            self.assertEqual(miss["reason"], x["cache_miss"]["reason"])
            self.assertEqual(miss["position"], x["cache_miss"]["position"])
            self.assertEqual(cached // PAGE, x["cached_tokens"] // PAGE)

            # Explaining what was just run: a hit, and nothing else changes.
            x = post(srv, "/v1/cache/explain", body)
            self.assertIsNone(x["cache_miss"]["reason"], x)

            # A bad body is a 400 naming the field.
            with self.assertRaises(urllib.error.HTTPError) as e:
                post(srv, "/v1/cache/explain", {"messages": "not a list"})
            self.assertEqual(e.exception.code, 400)
            self.assertIn("messages", e.exception.read().decode())

            counts = misses(srv)
            self.assertEqual(counts["no_cache"], 1)
            self.assertEqual(counts["system_changed"], 1)
            self.assertEqual(counts["tools_changed"], 2)

    def test_evicted_from_a_small_device_pool(self):
        with harness.Scratch() as scratch:
            # 12M of KV and no host or disk tier: a few documents fill it.
            srv = self.start(scratch, "-c", "1024", kv="12M")
            client = self.openai(srv)
            m = metrics(srv)
            capacity = int(m["cairn_kv_device_pages_total"])
            first = [{"role": "user", "content": document(0, 12) + "\nSummarise note 0.3."}]
            self.assertLess(n_tokens(srv, first), capacity * PAGE // 2)
            self.chat(client, first)
            pushed = 0
            seed = 1
            while pushed < 3 * capacity * PAGE:  # far more than the pool holds
                other = [{"role": "user", "content": document(seed, 12) + "\nSummarise."}]
                self.chat(client, other)
                pushed += n_tokens(srv, other)
                seed += 1
            cached, miss, _ = self.chat(client, first)
            self.assertEqual(miss["reason"], "evicted", miss)
            self.assertEqual(miss["evicted_tier"], "device", miss)
            self.assertLess(cached, n_tokens(srv, first) // 2)
            self.assertEqual(misses(srv)["evicted"], 1)

    def test_no_cache_after_restart_without_cache_dir(self):
        with harness.Scratch() as scratch:
            srv = self.start(scratch)
            client = self.openai(srv)
            conv = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER1}]
            _, miss, _ = self.chat(client, conv)
            self.assertEqual(miss["reason"], "no_cache")
            cached, miss, _ = self.chat(client, conv)
            self.assertIsNone(miss["reason"])
            self.assertGreater(cached, 0)
            srv = scratch.track(srv.restart(kill=True))
            client = self.openai(srv)
            cached, miss, _ = self.chat(client, conv)
            self.assertEqual(cached, 0)
            self.assertEqual(miss["reason"], "no_cache", miss)
            self.assertEqual(misses(srv)["no_cache"], 1)

    def test_other_tenant_only(self):
        with harness.Scratch() as scratch:
            alice, bob = "alice-token-5d1c9e27a04b", "bob-token-83f0a6d2c9e1"
            path = scratch.path("tenants")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write("alice %s\nbob %s\n" % (alice, bob))
            srv = self.start(scratch, "--tenants", path)
            conv = [{"role": "user", "content": document(3, 10) + "\nWhat does note 3.2 say?"}]
            _, miss, _ = self.chat(self.openai(srv, alice), conv)
            self.assertEqual(miss["reason"], "no_cache")
            cached, miss, _ = self.chat(self.openai(srv, bob), conv)
            self.assertEqual(cached, 0)
            self.assertEqual(miss["reason"], "other_tenant_only", miss)
            self.assertEqual(miss["cached_excerpt"], "", "another tenant's text leaked")
            cached, miss, _ = self.chat(self.openai(srv, bob), conv)
            self.assertIsNone(miss["reason"])
            # explain answers for the asking tenant only
            x = post(srv, "/v1/cache/explain", {"messages": conv}, key=alice)
            self.assertIsNone(x["cache_miss"]["reason"])
            conv2 = [{"role": "user", "content": document(3, 10) + "\nAnd note 3.4?"}]
            _, miss, _ = self.chat(self.openai(srv, alice), conv2)
            self.assertEqual(miss["reason"], "new_content", miss)

    def test_in_flight(self):
        with harness.Scratch() as scratch:
            srv = self.start(scratch)
            client = self.openai(srv)
            doc = document(5, 40)
            a = [{"role": "user", "content": doc + "\nWhat does note 5.1 say?"}]
            b = [{"role": "user", "content": doc + "\nWhat does note 5.2 say?"}]
            self.assertGreater(n_tokens(srv, a), 1200)
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                runs = [pool.submit(self.chat, client, m) for m in (a, b)]
                reasons = sorted(str(f.result()[1]["reason"]) for f in runs)
            # one computes the document, the other waits for it and reuses it
            self.assertEqual(reasons, ["in_flight", "no_cache"])
            self.assertEqual(misses(srv)["in_flight"], 1)

    def test_anthropic_and_native_protocol(self):
        try:
            import anthropic
        except ImportError:
            raise unittest.SkipTest("the anthropic package is not installed")
        with harness.Scratch() as scratch:
            srv = self.start(scratch, "--port", "0")
            client = anthropic.Anthropic(base_url=srv.http_url, api_key="unused", max_retries=0)
            msgs = [{"role": "user", "content": USER1}]

            def ask(system):
                r = client.messages.create(model="cairn", system=system, messages=msgs,
                                           max_tokens=2)
                return r.usage.model_dump().get("cache_miss")
            self.assertEqual(ask(SYSTEM)["reason"], "no_cache")
            miss = ask("Session 51b2. " + SYSTEM)
            self.assertEqual(miss["reason"], "system_changed", miss)

            # OpenAI's Responses API: usage.input_tokens_details.cache_miss
            responses = self.openai(srv).responses

            def respond(instructions):
                r = responses.create(model="cairn", instructions=instructions, input=USER1,
                                     max_output_tokens=2)
                return r.usage.input_tokens_details.model_extra.get("cache_miss")
            self.assertIsNone(respond(SYSTEM)["reason"])  # what /v1/messages computed
            miss = respond("Session 77c1. " + SYSTEM)
            self.assertEqual(miss["reason"], "system_changed", miss)

            # The native protocol: the same conversation, the same answer.
            native = scratch.client(srv)
            conv = [{"role": "system", "content": "Session 9e0d. " + SYSTEM}] + msgs
            x = post(srv, "/v1/cache/explain", {"messages": conv})
            res = native.generate(messages=conv, max_tokens=2, temperature=0)
            miss = res.usage.cache_miss
            self.assertIsNotNone(miss)
            self.assertEqual(miss["reason"], "system_changed", miss)
            self.assertEqual(miss["position"], x["cache_miss"]["position"])
            self.assertTrue(miss["prompt_excerpt"] and all(isinstance(t, int)
                                                           for t in miss["prompt_excerpt"]))
            res = native.generate(messages=conv, max_tokens=2, temperature=0)
            self.assertIsNone(res.usage.cache_miss["reason"])
            self.assertEqual(misses(srv)["system_changed"], 3)


if __name__ == "__main__":
    harness.main()
