#!/usr/bin/env python3
"""Integration tests of `cairn serve` through the Python client (real binary,
real model, TCP and a Unix socket). Written against docs/protocol.md.

usage: test_server.py CAIRN_BIN MODEL [unittest args...]

Every test class starts its own server (`--port 0` plus a Unix socket in a
temporary directory), waits for its "listening" line and always stops it in
tearDownClass. Everything is greedy (temperature 0), so results are exact;
waits have generous limits that only guard against hangs.

Expectations about `cached_tokens` (docs/protocol.md + store/store.h): the
cache reuses KV to the token, and only tokens whose KV was computed. After
a generation over prompt + generated tokens of length h, the KV of the first
h-1 tokens exists (the last sampled token is never fed back), so the next
request starting with those h tokens finds h-1 of them, or h if the server
also ran the last token. A request sharing exactly L leading tokens with an
earlier one finds L of them (whole pages by match, the rest of the last page
copied), never the whole of its own prompt: its last token is computed for
its logits. A prompt that shares nothing but a few leading tokens (BOS, a
first word) with earlier ones finds those: less than a page.
"""
import json
import os
import random
import re
import socket
import stat
import subprocess
import sys
import threading
import unittest

import msgpack

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import HANG_GUARD_S, STORIES  # noqa: E402
import cairn_client  # noqa: E402

CAIRN, MODEL = harness.take_argv("CAIRN_BIN", "MODEL", usage=__doc__)

PROMPTS = [
    "Once upon a time",
    "The little dog",
    "Lily and Tom went to the park",
    "One day, a big bear",
    "The sun was hot and",
    "Sam had a red ball.",
    "In the forest there was",
    "Mom said",
]

_expected_cache = {}


def cairn_run_greedy(prompt, n):
    """(text, token ids) of `cairn run` for the prompt, greedy, n tokens."""
    key = (prompt, n)
    if key not in _expected_cache:
        r = subprocess.run([CAIRN, "run", "-m", MODEL, "-p", prompt, "-n", str(n), "--temp", "0",
                            "-v"], capture_output=True, timeout=HANG_GUARD_S)
        if r.returncode != 0:
            raise AssertionError("cairn run failed: " + r.stderr.decode())
        out = r.stdout.decode()
        assert out.endswith("\n")
        ids = [int(x) for x in re.findall(r"\[(\d+)\]", r.stderr.decode())]
        _expected_cache[key] = (out[:-1], ids)  # `cairn run` ends its output with a newline
    return _expected_cache[key]


class ServerCase(harness.TestCase):
    """Starts a server for the class; `self.c` is a connected TCP client."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = cls.class_scratch("cairn-test-")
        cls.sock_path = cls.tmp.path("cairn.sock")
        cls.server = cls.tmp.start(CAIRN, ["-m", MODEL], tcp=True, unix_path=cls.sock_path)
        cls.c = cls.tmp.client(cls.server, timeout=HANG_GUARD_S)
        cls.info = cls.c.info()
        cls.P = int(cls.info["page_size"])
        cls.n_ctx = int(cls.info["model"]["n_ctx"])

    def tearDown(self):
        self.assertAlive(self.server)

    def new_client(self, unix=False):
        return self.server.client(timeout=HANG_GUARD_S, unix=unix)

    def tok(self, text, bos):
        return self.c.tokenize(text, add_bos=bos)

    def greedy(self, client=None, **kw):
        return (client or self.c).generate(temperature=0, **kw)

    def assertCachedAfterHistory(self, cached, h):
        self.assertGreaterEqual(cached, h - 1, f"history {h}")
        self.assertLessEqual(cached, h, f"history {h}")


# --------------------------------------------------------------------------
class Basics(ServerCase):
    def test_server_info(self):
        i = self.info
        self.assertIsInstance(i["version"], str)
        for k in ("name", "arch", "n_ctx", "n_vocab"):
            self.assertIn(k, i["model"])
        self.assertEqual(i["model"]["n_vocab"], 512)
        self.assertGreater(self.P, 0)
        for k in ("max_message_bytes", "max_depth", "max_string_bytes", "max_array_len",
                  "max_map_len", "max_tokens", "max_stop"):
            self.assertIn(k, i["limits"], k)

    def test_tokenize_matches_cli(self):
        self.assertEqual(self.c.tokenize("Once upon a time"), [1, 403, 407, 261, 378])
        self.assertEqual(self.c.tokenize("Once upon a time", add_bos=False), [403, 407, 261, 378])
        self.assertEqual(self.c.detokenize([403, 407, 261, 378]).strip(), "Once upon a time")

    def test_concurrent_greedy_equals_cairn_run(self):
        # 8 different prompts at once on one connection (8 threads), plus the
        # same set again on a second connection, one of them streamed; one
        # prompt is long (~700 tokens, several prefill chunks) so prefill and
        # decoding of other requests share steps.
        prompts = PROMPTS[:-1] + [" ".join(STORIES.split()[:300])]
        jobs = [(p, 40 + 16 * i) for i, p in enumerate(prompts)]
        expected = {p: cairn_run_greedy(p, n) for p, n in jobs}
        results, errors = {}, []
        other = self.new_client()

        def worker(client, p, n, key):
            try:
                results[key] = self.greedy(client, prompt=p, max_tokens=n)
            except BaseException as e:  # reported below, in the main thread
                errors.append((key, e))

        threads = [threading.Thread(target=worker, args=(self.c, p, n, ("a", p))) for p, n in jobs]
        threads += [threading.Thread(target=worker, args=(other, p, n, ("b", p)))
                    for p, n in jobs[1:]]
        stream = other.generate(prompt=jobs[0][0], max_tokens=jobs[0][1], temperature=0,
                                stream=True)
        for t in threads:
            t.start()
        items = list(stream)
        for t in threads:
            t.join()
        other.close()
        self.assertEqual(errors, [])
        results[("b", jobs[0][0])] = items[-1]
        for (side, p), r in results.items():
            text, ids = expected[p]
            n = dict(jobs)[p]
            with self.subTest(side=side, prompt=p):
                self.assertEqual(r.text, text)
                self.assertEqual(r.tokens, ids)
                self.assertEqual(r.usage.completion_tokens, len(ids))
                self.assertEqual(r.usage.prompt_tokens, len(self.tok(p, True)))
                self.assertEqual(r.finish_reason, "length" if len(ids) == n else "stop")
        deltas = items[:-1]
        self.assertTrue(all(isinstance(d, cairn_client.Delta) for d in deltas))
        self.assertGreater(len(deltas), 0)
        self.assertEqual("".join(d.text for d in deltas), items[-1].text)
        self.assertEqual([t for d in deltas for t in d.tokens], items[-1].tokens)

    def test_tokens_prompt_equals_text_prompt(self):
        p, n = PROMPTS[2], 20
        r = self.greedy(tokens=self.tok(p, True), max_tokens=n)
        self.assertEqual(r.text, cairn_run_greedy(p, n)[0])

    def test_stop_string(self):
        text, _ = cairn_run_greedy(PROMPTS[0], 32)
        stop = "Lily"
        self.assertIn(stop, text)
        r = self.greedy(prompt=PROMPTS[0], max_tokens=32, stop=[stop])
        self.assertEqual(r.finish_reason, "stop")
        self.assertEqual(r.text, text[: text.index(stop)])

    def test_logit_bias(self):
        plain = self.greedy(prompt="Once upon", max_tokens=4)
        first = plain.tokens[0]
        banned = self.greedy(prompt="Once upon", max_tokens=4, logit_bias={first: -100})
        self.assertNotEqual(banned.tokens[0], first)
        self.assertNotIn(first, banned.tokens)
        # keys as integers or as their decimal text (what JSON-born maps hold)
        forced = self.greedy(prompt="Once upon", max_tokens=4, logit_bias={str(first): 100})
        self.assertEqual(forced.tokens, [first] * 4)
        sid = self.c.session_open(text="Once upon")["session_id"]
        r = self.c.session_generate(sid, max_tokens=3, temperature=0,
                                    logit_bias={first: 100, first + 1: -5.5})
        self.assertEqual(r.tokens, [first] * 3)
        self.c.session_close(sid)
        for bad in ({-1: 1}, {self.info["model"]["n_vocab"]: 1}, {"x": 1}, {5: 100.5},
                    {5: "a"}, [1], {i: 1 for i in range(301)}):
            with self.subTest(logit_bias=bad):
                with self.assertRaises((cairn_client.InvalidRequest, cairn_client.TooLarge)):
                    self.greedy(prompt="Once upon", max_tokens=2, logit_bias=bad)

    def test_cache_stats_fields(self):
        s = self.c.cache_stats()
        for k in ("queries", "prompt_tokens", "cached_tokens", "generated_tokens", "hit_rate",
                  "pages", "device_pages_total", "device_pages_free", "evicted_pages", "paused",
                  "partial_tokens", "shared_waits", "running", "waiting", "sessions"):
            self.assertIn(k, s)
        for k in ("device", "host", "disk"):
            self.assertIn(k, s["pages"])


# --------------------------------------------------------------------------
class PrefixCache(ServerCase):
    DOC = "Zed the zebra kept a notebook. " + " ".join(STORIES.split()[:160])

    def test_shared_prefix_is_cached_and_output_unchanged(self):
        q1 = self.DOC + "\nQuestion: Who is the dog?"
        q2 = self.DOC + "\nQuestion: What did Sue find?"
        t1, t2 = self.tok(q1, True), self.tok(q2, True)
        common = 0
        while common < min(len(t1), len(t2)) and t1[common] == t2[common]:
            common += 1
        self.assertGreater(common, 4 * self.P)  # the test means something

        r1 = self.greedy(prompt=q1, max_tokens=16)
        self.assertEqual(r1.usage.prompt_tokens, len(t1))
        self.assertLess(r1.usage.cached_tokens, self.P)  # nothing else starts like DOC
        r2 = self.greedy(prompt=q2, max_tokens=16)
        self.assertEqual(r2.usage.prompt_tokens, len(t2))
        self.assertEqual(r2.usage.cached_tokens, common)  # to the token
        # reusing the cached KV changes nothing in the output
        self.assertEqual(r2.text, cairn_run_greedy(q2, 16)[0])
        # the same prompt again: all its whole pages but never the whole prompt
        r3 = self.greedy(prompt=q2, max_tokens=16)
        self.assertEqual(r3.text, r2.text)
        self.assertGreaterEqual(r3.usage.cached_tokens, r2.usage.cached_tokens)
        self.assertLess(r3.usage.cached_tokens, len(t2))
        self.assertEqual(r3.usage.cached_tokens, len(t2) - 1)
        s = self.c.cache_stats()
        self.assertGreaterEqual(s["cached_tokens"], r2.usage.cached_tokens + r3.usage.cached_tokens)

    def test_session_second_turn_reports_history_cached(self):
        first = "Zoe the zebra had a kite. " + self.DOC[31:400]
        second = " Then Zoe"
        n0 = len(self.tok(first, True))
        s = self.c.session_open(text=first)
        sid = s["session_id"]
        self.assertRegex(sid, r"^[0-9a-f]{32}$")
        self.assertEqual(s["n_tokens"], n0)
        r1 = self.c.session_generate(sid, max_tokens=20, temperature=0)
        self.assertEqual(r1.usage.prompt_tokens, n0)
        self.assertLess(r1.usage.cached_tokens, self.P)  # BOS and a word at most
        h = self.c.session_info(sid)["n_tokens"]
        self.assertEqual(h, n0 + r1.usage.completion_tokens)
        self.assertGreater(h, 3 * self.P)

        r2 = self.c.session_generate(sid, text=second, max_tokens=20, temperature=0)
        t2 = self.tok(second, False)
        self.assertEqual(r2.usage.prompt_tokens, h + len(t2))
        self.assertCachedAfterHistory(r2.usage.cached_tokens, h)
        # what the session generated is what a stateless request over the
        # same tokens generates
        history = self.tok(first, True) + r1.tokens + t2
        self.assertEqual(r2.tokens, self.greedy(tokens=history, max_tokens=20).tokens)
        self.assertEqual(self.c.session_info(sid)["n_tokens"], h + len(t2) + len(r2.tokens))
        self.assertTrue(self.c.session_close(sid))

    def test_session_messages_use_generic_chat_format(self):
        msgs = [{"role": "system", "content": "You tell stories."},
                {"role": "user", "content": "Tell me about a cat."}]
        s = self.c.session_open(messages=msgs)
        rendered = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in msgs)
        self.assertEqual(s["n_tokens"], len(self.tok(rendered, True)))
        r = self.c.session_generate(s["session_id"], messages=[{"role": "user", "content": "Go."}],
                                    max_tokens=8, temperature=0)
        added = len(self.tok("<|user|>\nGo.\n<|assistant|>\n", False))
        self.assertEqual(r.usage.prompt_tokens, s["n_tokens"] + added)
        self.c.session_close(s["session_id"])


# --------------------------------------------------------------------------
class Tools(ServerCase):
    """OpenAI-style tools over the native protocol on a model that was never
    trained to call one: tool_choice forces the call (a grammar over the
    tool's parameters), the result carries it parsed, and misplaced or
    malformed tools (a malformed parameters schema included) are invalid
    requests."""
    BOOK = {"type": "function", "function": {"name": "book_table", "parameters": {
        "type": "object",
        "properties": {"day": {"enum": ["mon", "tue", "wed"]},
                       "guests": {"type": "integer"}},
        "required": ["day", "guests"]}}}
    CAT = {"type": "function", "function": {"name": "feed_cat", "parameters": {
        "type": "object", "properties": {"food": {"type": "string", "maxLength": 12}},
        "required": ["food"]}}}

    def test_forced_call_in_a_session(self):
        msgs = [{"role": "user", "content": "Book a table."}]
        sid = self.c.session_open(messages=msgs, tools=[self.BOOK, self.CAT])["session_id"]
        named = {"type": "function", "function": {"name": "book_table"}}
        for seed in range(3):
            branch = self.c.session_fork(sid)
            r = self.c.session_generate(branch, messages=[], tools=[self.BOOK, self.CAT],
                                        tool_choice=named, max_tokens=200, temperature=1.0,
                                        seed=seed)
            with self.subTest(seed=seed):
                self.assertEqual(r.finish_reason, "tool_calls", r)
                self.assertEqual(len(r.tool_calls), 1, r)
                call = r.tool_calls[0]
                self.assertEqual(call["type"], "function")
                self.assertEqual(call["function"]["name"], "book_table")
                args = json.loads(call["function"]["arguments"])
                self.assertIn(args["day"], ("mon", "tue", "wed"))
                self.assertIsInstance(args["guests"], int)
                self.assertEqual(r.content, "")
                # the reply joined the session's history as generated
                n = self.c.session_info(branch)["n_tokens"]
                self.assertEqual(n, r.usage.prompt_tokens + len(r.tokens))
            self.c.session_close(branch)
        # "required", one call (parallel_tool_calls false), of either tool
        r = self.c.session_generate(sid, messages=[], tools=[self.BOOK, self.CAT],
                                    tool_choice="required", parallel_tool_calls=False,
                                    max_tokens=200, temperature=0)
        self.assertEqual(r.finish_reason, "tool_calls", r)
        self.assertEqual(len(r.tool_calls), 1)
        self.assertIn(r.tool_calls[0]["function"]["name"], ("book_table", "feed_cat"))
        # ids are unique across replies
        r2 = self.c.session_generate(sid, messages=[{"role": "user", "content": "Again."}],
                                     tools=[self.BOOK], tool_choice="required",
                                     parallel_tool_calls=False, max_tokens=200, temperature=0)
        self.assertEqual(r2.finish_reason, "tool_calls", r2)
        self.assertNotEqual(r.tool_calls[0]["id"], r2.tool_calls[0]["id"])
        # without tools nothing is read: a call-shaped reply is plain text
        shape = {"type": "object", "properties": {"name": {"const": "feed_cat"},
                                                  "arguments": {
                                                      "type": "object",
                                                      "properties": {"food": {"const": "milk"}},
                                                      "required": ["food"]}},
                 "required": ["name", "arguments"]}
        r3 = self.c.session_generate(sid, messages=[], max_tokens=200, temperature=0,
                                     response_format={"type": "json_schema",
                                                      "json_schema": {"schema": shape}})
        self.assertEqual(json.loads(r3.text)["name"], "feed_cat")
        self.assertEqual((r3.finish_reason, r3.tool_calls, r3.content), ("stop", [], None))
        # an assistant message may carry calls (content nil), a tool answers
        follow = [{"role": "assistant", "content": None, "tool_calls": r2.tool_calls},
                  {"role": "tool", "tool_call_id": r2.tool_calls[0]["id"], "content": "booked"}]
        s2 = self.c.session_open(messages=msgs + follow, tools=[self.BOOK])
        self.assertGreater(s2["n_tokens"], 0)
        self.c.session_close(s2["session_id"])
        self.c.session_close(sid)

    def test_stateless_generate_with_messages_and_tools(self):
        msgs = [{"role": "system", "content": "You tell stories."},
                {"role": "user", "content": "Tell me about a cat."}]
        # the conversation in the generic format, then the assistant cue
        g = self.c.generate(messages=msgs, max_tokens=8, temperature=0)
        rendered = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in msgs) + "<|assistant|>\n"
        want = self.greedy(tokens=self.tok(rendered, True), max_tokens=8)
        self.assertEqual((g.usage.prompt_tokens, g.tokens), (want.usage.prompt_tokens, want.tokens))
        # a trailing assistant message is continued (its text, no new turn)
        pre = msgs + [{"role": "assistant", "content": "Once upon a time"}]
        g = self.c.generate(messages=pre, max_tokens=8, temperature=0)
        want = self.greedy(tokens=self.tok(rendered + "Once upon a time", True), max_tokens=8)
        self.assertEqual((g.usage.prompt_tokens, g.tokens), (want.usage.prompt_tokens, want.tokens))
        # tools: a forced call comes back parsed
        r = self.c.generate(messages=msgs, tools=[self.BOOK], tool_choice="required",
                            parallel_tool_calls=False, max_tokens=200, temperature=0)
        self.assertEqual(r.finish_reason, "tool_calls", r)
        self.assertEqual(r.tool_calls[0]["function"]["name"], "book_table")
        with self.assertRaises(cairn_client.InvalidRequest):
            self.c.call("generate", {"prompt": "x", "tools": [self.BOOK]})
        with self.assertRaises(cairn_client.InvalidRequest):
            self.c.call("generate", {"prompt": "x", "messages": msgs})

    def test_tools_errors(self):
        msgs = [{"role": "user", "content": "Hi."}]
        sid = self.c.session_open(messages=msgs)["session_id"]
        bad = [
            ("session.append", {"session_id": sid, "text": "x", "tools": [self.BOOK]}),
            ("session.open", {"text": "x", "tools": [self.BOOK]}),
            ("session.open", {"messages": msgs, "tools": [self.BOOK], "tool_choice": "required"}),
            ("session.generate", {"session_id": sid, "tools": {"a": 1}}),
            ("session.generate", {"session_id": sid, "tools": [{"type": "function"}]}),
            ("session.generate", {"session_id": sid, "tools": [self.BOOK], "tool_choice": "some"}),
            ("session.generate", {"session_id": sid, "tool_choice": "required"}),
            ("session.generate", {"session_id": sid, "tools": [self.BOOK],
                                  "tool_choice": {"type": "function",
                                                  "function": {"name": "nope"}}}),
            ("session.generate", {"session_id": sid, "tools": [self.BOOK],
                                  "tool_choice": "required", "parallel_tool_calls": "yes"}),
            ("session.append", {"session_id": sid, "messages": [
                {"role": "user", "content": "x", "tool_calls": []}]}),
            ("session.append", {"session_id": sid, "messages": [
                {"role": "assistant", "tool_calls": "not a list"}]}),
        ]
        for method, params in bad:
            with self.subTest(method=method, params=params):
                with self.assertRaises(cairn_client.InvalidRequest):
                    self.c.call(method, params)
        # a malformed parameters schema, whatever tool_choice says, names the tool
        malformed = [{"type": "object", "properties": "nope"},
                     {"type": "object", "properties": {"d": {"$ref": "#/$defs/Missing"}}}]
        for schema in malformed:
            tools = [self.BOOK, {"type": "function",
                                 "function": {"name": "broken", "parameters": schema}}]
            for method, params in (
                    ("session.open", {"messages": msgs, "tools": tools}),
                    ("generate", {"messages": msgs, "tools": tools, "tool_choice": "required"}),
                    ("session.generate", {"session_id": sid, "tools": tools}),
                    ("session.generate", {"session_id": sid, "tools": tools,
                                          "tool_choice": "none"}),
                    ("session.generate", {"session_id": sid, "tools": tools,
                                          "tool_choice": "required"})):
                with self.subTest(method=method, schema=schema, choice=params.get("tool_choice")):
                    with self.assertRaises(cairn_client.InvalidRequest) as cm:
                        self.c.call(method, dict(params, max_tokens=4))
                    self.assertIn("tools[1].function.parameters", str(cm.exception))
        # the session is untouched and still serves
        self.assertEqual(self.c.session_info(sid)["n_tokens"],
                         self.c.session_open(messages=msgs)["n_tokens"])
        self.c.session_close(sid)


# --------------------------------------------------------------------------
class Sessions(ServerCase):
    BASE = "Once upon a time, there was a girl named Mia. Mia had a little cat. The cat liked milk."

    def open_with_history(self, extra_gen=16):
        """A session over BASE plus `extra_gen` greedy tokens; returns
        (session_id, its full token history)."""
        toks = self.tok(self.BASE, True)
        sid = self.c.session_open(tokens=toks)["session_id"]
        r = self.c.session_generate(sid, max_tokens=extra_gen, temperature=0)
        self.assertEqual(r.finish_reason, "length")
        return sid, toks + r.tokens

    def test_fork(self):
        parent, hist = self.open_with_history()
        child = self.c.session_fork(parent)
        self.assertNotEqual(child, parent)
        self.assertEqual(self.c.session_info(child)["n_tokens"], len(hist))
        self.assertEqual(self.c.session_info(parent)["n_tokens"], len(hist))

        # a greedy continuation of the fork equals the parent's, and both
        # equal a stateless request over the same history
        rp = self.c.session_generate(parent, max_tokens=12, temperature=0)
        rc = self.c.session_generate(child, max_tokens=12, temperature=0)
        self.assertEqual(rc.tokens, rp.tokens)
        self.assertEqual(rc.text, rp.text)
        self.assertEqual(rp.tokens, self.greedy(tokens=hist, max_tokens=12).tokens)
        # the fork found the parent's pages
        self.assertCachedAfterHistory(rc.usage.cached_tokens, len(hist))
        hist += rp.tokens

        # then the branches diverge and stay independent
        a, b = self.tok(" The cat ran", False), self.tok(" Mia sang a song", False)
        self.assertEqual(self.c.session_append(parent, tokens=a)["n_tokens"], len(hist) + len(a))
        self.assertEqual(self.c.session_info(child)["n_tokens"], len(hist))
        rb = self.c.session_generate(child, tokens=b, max_tokens=12, temperature=0)
        ra = self.c.session_generate(parent, max_tokens=12, temperature=0)
        self.assertEqual(ra.tokens, self.greedy(tokens=hist + a, max_tokens=12).tokens)
        self.assertEqual(rb.tokens, self.greedy(tokens=hist + b, max_tokens=12).tokens)
        self.assertNotEqual(ra.tokens, rb.tokens)
        self.assertEqual(self.c.session_info(parent)["n_tokens"], len(hist) + len(a) + 12)
        self.assertEqual(self.c.session_info(child)["n_tokens"], len(hist) + len(b) + 12)

        # closing the parent leaves the fork alive
        self.assertTrue(self.c.session_close(parent))
        with self.assertRaises(cairn_client.NotFound):
            self.c.session_info(parent)
        self.assertEqual(self.c.session_info(child)["n_tokens"], len(hist) + len(b) + 12)
        self.c.session_close(child)

    def test_truncate(self):
        sid, hist = self.open_with_history(extra_gen=20)
        keep = len(hist) - 27
        self.assertEqual(self.c.session_truncate(sid, keep), keep)
        self.assertEqual(self.c.session_info(sid)["n_tokens"], keep)
        r = self.c.session_generate(sid, max_tokens=16, temperature=0)
        self.assertEqual(r.tokens, self.greedy(tokens=hist[:keep], max_tokens=16).tokens)
        self.assertCachedAfterHistory(r.usage.cached_tokens, keep)
        self.assertEqual(self.c.session_info(sid)["n_tokens"], keep + 16)
        # growing by truncate is not possible; negative lengths are rejected
        # (out of range: the server answers too_large; invalid_request would do too)
        with self.assertRaises((cairn_client.TooLarge, cairn_client.InvalidRequest)):
            self.c.session_truncate(sid, keep + 1000)
        self.assertEqual(self.c.session_info(sid)["n_tokens"], keep + 16)
        with self.assertRaises(cairn_client.InvalidRequest):
            self.c.session_truncate(sid, -1)
        self.c.session_close(sid)

    def test_concurrent_generates_on_one_session(self):
        # Two turns at once on one session: each either runs (one after the
        # other) or is refused with an error; the history is the sum of the
        # ones that ran, never a mix.
        sid, hist = self.open_with_history(extra_gen=4)
        calls = [self.c.call_async("session.generate", {"session_id": sid, "max_tokens": 8,
                                                         "temperature": 0}) for _ in range(2)]
        ran = 0
        for call in calls:
            try:
                r = call.result(HANG_GUARD_S)
                self.assertEqual(len(r["tokens"]), 8)
                ran += 1
            except cairn_client.CairnError as e:
                self.assertIn(e.type, ("overloaded", "invalid_request"))
        self.assertGreaterEqual(ran, 1)
        self.assertEqual(self.c.session_info(sid)["n_tokens"], len(hist) + 8 * ran)
        self.c.session_close(sid)

    def test_bad_session_ids(self):
        with self.assertRaises(cairn_client.NotFound):
            self.c.session_info("0123456789abcdef0123456789abcdef")
        with self.assertRaises(cairn_client.NotFound):
            self.c.session_generate("f" * 32, text="hi", max_tokens=2)
        for bad in ("xyz", "Z" * 32, "0" * 31, "0" * 33, 12345, None, ["a"]):
            with self.subTest(session_id=bad):
                with self.assertRaises(cairn_client.InvalidRequest):
                    self.c.call("session.info", {"session_id": bad})
        with self.assertRaises(cairn_client.InvalidRequest):
            self.c.call("session.info", {})


# --------------------------------------------------------------------------
class CancelAndDisconnect(ServerCase):
    # Greedy on this prompt runs to the end of the context without an
    # end-of-text token, so a generation of max_tokens = the rest of the
    # context is still running when the cancel (sent after its first delta)
    # arrives; the margin is the whole generation against one round trip.
    LONG = "Once upon a time"

    def long_stream(self, client):
        max_tokens = self.n_ctx - len(self.tok(self.LONG, True))
        return client.generate(prompt=self.LONG, max_tokens=max_tokens, temperature=0,
                               stream=True), max_tokens

    def test_cancel_mid_stream(self):
        stream, max_tokens = self.long_stream(self.c)
        first = next(stream)
        self.assertIsInstance(first, cairn_client.Delta)
        self.assertTrue(stream.cancel())
        r = stream.wait()
        self.assertEqual(r.finish_reason, "cancelled")
        self.assertLess(r.usage.completion_tokens, max_tokens)
        self.assertEqual(len(r.tokens), r.usage.completion_tokens)
        # what came out before the cancel is the greedy output's beginning
        ids = cairn_run_greedy(self.LONG, 64)[1]
        k = min(len(r.tokens), 64)
        self.assertEqual(r.tokens[:k], ids[:k])
        # cancelling a finished or unknown request is harmless
        try:
            self.assertFalse(self.c.cancel(stream.msgid))
        except cairn_client.NotFound:
            pass
        self.assertEqual(self.greedy(prompt=PROMPTS[1], max_tokens=16).text,
                         cairn_run_greedy(PROMPTS[1], 16)[0])

    def test_disconnect_mid_stream(self):
        gone = self.new_client()
        streams, max_tokens = [], 0
        for _ in range(3):
            s, max_tokens = self.long_stream(gone)
            streams.append(s)
        for s in streams:
            self.assertIsInstance(next(s), cairn_client.Delta)
        gone.close()
        for s in streams:
            with self.assertRaises(cairn_client.CairnConnectionError):
                s.wait()
        # The server notices the close on its own schedule; poll (bounded,
        # a hang guard) until nothing of that client is running.
        st = harness.wait_idle(self.c)
        self.assertEqual((st["running"], st["waiting"]), (0, 0))
        # They were cancelled, not run to the end: a client that only half
        # closes (EOF on the server's side, it still reads) sees the server
        # close after it cancelled its streams, with no final answer for any
        # (one that ran to its end would have one). Not a bound on the tokens
        # generated, which would depend on the speed.
        s = harness.connect(self.server.address)
        self.addCleanup(s.close)
        for m in (1, 2, 3):
            s.sendall(harness.request("generate", {"prompt": self.LONG, "max_tokens": max_tokens,
                                                   "temperature": 0, "stream": True}, m))
        up, got, started = harness.unpacker(), [], set()
        while started != {1, 2, 3}:  # every stream has started
            chunk = s.recv(65536)
            self.assertTrue(chunk, "closed before streaming")
            up.feed(chunk)
            for m in up:
                got.append(m)
                if m[0] == 2:
                    started.add(m[2][0]["request"])
        s.shutdown(socket.SHUT_WR)
        rest, closed = harness.read_until_closed(s)
        self.assertTrue(closed)
        up.feed(rest)
        answers = [m for m in got + list(up) if m[0] == 1]
        self.assertEqual(answers, [], "a stream ran to its end instead of being cancelled")
        self.assertEqual(harness.wait_idle(self.c)["running"], 0)
        with self.new_client() as fresh:
            self.assertEqual(self.greedy(fresh, prompt=PROMPTS[3], max_tokens=24).text,
                             cairn_run_greedy(PROMPTS[3], 24)[0])


# --------------------------------------------------------------------------
# raw_exchange(address, data, half_close=False): send raw bytes; (messages
# received, closed) once a response arrives or the server closes the
# connection. request(method, params, msgid=7): [0, msgid, method, params]
# with params as given (here often not the array of one map it should be).
raw_exchange = harness.exchange_until_response
request = harness.pack_request


class Malformed(ServerCase):
    """Bad input gets an error response (when the msgid is readable) or a
    closed connection; the server survives and a bystander is unaffected."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.bystander = cls.tmp.client(cls.server, timeout=HANG_GUARD_S)
        cls.expected = cairn_run_greedy(PROMPTS[5], 16)[0]

    def tearDown(self):
        super().tearDown()
        # the connection opened before the bad input still works, and so does a new one
        self.assertEqual(self.greedy(self.bystander, prompt=PROMPTS[5], max_tokens=16).text,
                         self.expected)
        with self.new_client() as c:
            self.assertEqual(c.info()["page_size"], self.P)

    def addr(self):
        return self.server.address

    def expect_error_or_close(self, data, types=("invalid_request",), msgid=7,
                              allow_close=None, half_close=False):
        """The error response of `types` that docs/protocol.md promises for a
        malformed message whose msgid is readable (msgid given); a plain
        close only where the msgid is not readable (msgid=None) or where
        allow_close says so."""
        if allow_close is None:
            allow_close = msgid is None
        msgs, closed = raw_exchange(self.addr(), data, half_close=half_close)
        responses = [m for m in msgs if isinstance(m, list) and m and m[0] == 1]
        if responses:
            r = responses[0]
            self.assertEqual(len(r), 4, r)
            if msgid is not None:
                self.assertEqual(r[1], msgid, r)
            self.assertIsNone(r[3], r)
            self.assertIsInstance(r[2], dict, r)
            self.assertIn(r[2].get("type"), types, r)
            self.assertIsInstance(r[2].get("code"), int, r)
            self.assertIsInstance(r[2].get("message"), str, r)
            return r[2]
        self.assertTrue(allow_close, "expected an error response, the connection was closed")
        self.assertTrue(closed)
        return None

    def test_msgid_in_flight_is_refused_for_every_method(self):
        """While a generation with msgid 5 runs, any message reusing 5 — a
        local answer (server.info, tokenize), an engine call, a malformed
        one — gets "already in flight", and the only result for 5 is the
        generation's."""
        gen = request("generate", [{"prompt": "Once", "max_tokens": self.n_ctx - 8,
                                    "ignore_eos": True, "temperature": 0}], msgid=5)
        reuse = [request("server.info", [], msgid=5), request("tokenize", [{"text": "x"}], msgid=5),
                 request("session.info", [{"session_id": "0" * 32}], msgid=5),
                 request("generate", [{"prompt": 7}], msgid=5)]
        s = harness.connect(self.addr(), timeout=HANG_GUARD_S)
        try:
            s.sendall(gen + b"".join(reuse))
            up = harness.unpacker()
            answers = []
            while not any(m[0] == 1 and m[2] is None for m in answers):
                chunk = s.recv(1 << 16)
                self.assertTrue(chunk, "the server closed the connection")
                up.feed(chunk)
                answers.extend(m for m in up if m[0] == 1)
        finally:
            s.close()
        self.assertTrue(all(m[1] == 5 for m in answers), answers)
        errors = [m[2] for m in answers if m[2] is not None]
        results = [m[3] for m in answers if m[2] is None]
        self.assertEqual(len(results), 1)
        self.assertEqual(len(results[0]["tokens"]), self.n_ctx - 8, "not the generation's result")
        self.assertEqual(len(errors), len(reuse), answers)
        for e in errors:
            self.assertIn("already in flight", e["message"])

    def expect_call_error(self, method, params, exc=cairn_client.InvalidRequest):
        with self.assertRaises(exc) as cm:
            self.c.call(method, params)
        return cm.exception

    def test_garbage_bytes(self):
        noise = random.Random(1234).randbytes(4096)
        for data in (b"\xc1" * 16, b"\xff\xfe\xfd hello", noise,
                     msgpack.packb("just a string"), msgpack.packb({"a": 1}),
                     msgpack.packb([0]), msgpack.packb([5, 1, "x", [{}]])):
            with self.subTest(data=data[:16]):
                msgs, closed = raw_exchange(self.addr(), data + msgpack.packb([0, 9, "x", [{}]]))
                # either closed, or any answer is an error (never a result)
                for m in msgs:
                    if isinstance(m, list) and m and m[0] == 1:
                        self.assertIsNotNone(m[2], m)

    def test_structurally_wrong_requests(self):
        self.expect_error_or_close(request(123, [{}]))                      # method not a string
        self.expect_error_or_close(request("server.info", "notalist"))      # params not an array
        self.expect_error_or_close(request("server.info", [5]))             # params[0] not a map
        self.expect_error_or_close(msgpack.packb([0, 7, "server.info"]))    # too short
        self.expect_error_or_close(msgpack.packb([0, -7, "server.info", []]), msgid=None)
        self.expect_error_or_close(msgpack.packb([0, 2 ** 33, "server.info", []]), msgid=None)
        self.expect_error_or_close(msgpack.packb([0, "7", "server.info", []]), msgid=None)
        e = self.expect_error_or_close(request("no.such.method", [{}]), allow_close=False)
        self.assertEqual(e["code"], -1)
        # an empty params array means {}
        msgs, _ = raw_exchange(self.addr(), request("server.info", []))
        self.assertIsNone(msgs[-1][2])
        self.assertEqual(msgs[-1][3]["page_size"], self.P)

    def test_unknown_method_via_client(self):
        e = self.expect_call_error("no.such.method", {})
        self.assertEqual((e.code, e.type), (-1, "invalid_request"))

    def test_wrong_types_and_ranges(self):
        bad = [
            {},                                           # neither prompt nor tokens
            {"prompt": 5},
            {"prompt": ["a"]},
            {"tokens": "abc"},
            {"tokens": ["a", "b"]},
            {"tokens": [1, -3]},
            {"tokens": [1, 512]},                         # n_vocab is 512
            {"tokens": [1, 2 ** 40]},
            {"tokens": []},
            {"prompt": "hi", "max_tokens": "x"},
            {"prompt": "hi", "max_tokens": -1},
            {"prompt": "hi", "temperature": "hot"},
            {"prompt": "hi", "stop": 5},
            {"prompt": "hi", "stop": [1, 2]},
            {"prompt": "hi", "stream": "yes"},
            {"prompt": "hi", "seed": "abc"},
        ]
        for params in bad:
            with self.subTest(params=params):
                self.expect_call_error("generate", params)
        self.expect_call_error("tokenize", {"text": 3})
        self.expect_call_error("detokenize", {"tokens": [600]})
        self.expect_call_error("session.open", {"tokens": "x"})
        self.expect_call_error("session.truncate", {"session_id": "0" * 32, "n_tokens": "x"})
        self.expect_call_error("gen.cancel", {"request": "x"})

    def test_limits_are_per_field(self):
        """The generic map cap does not cut a field short: a native
        logit_bias takes the 300 entries docs/api.md promises (one more is
        too_large, naming the field), and a schema may have 100 properties."""
        bias = {str(t): -1.0 for t in range(300)}
        r = self.c.call("generate", {"prompt": "hi", "max_tokens": 4, "temperature": 0,
                                     "logit_bias": bias})
        self.assertIn("tokens", r)
        bias["300"] = -1.0
        e = self.expect_call_error("generate", {"prompt": "hi", "logit_bias": bias},
                                   cairn_client.TooLarge)
        self.assertIn("logit_bias", str(e))
        schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(100)},
                  "required": ["p0"], "additionalProperties": False}
        r = self.c.call("generate", {"prompt": "hi", "max_tokens": 8, "temperature": 0,
                                     "response_format": {"type": "json_schema",
                                                         "json_schema": {"schema": schema}}})
        self.assertIn("tokens", r)

    def test_limits(self):
        # docs/protocol.md: exceeding a limit is `too_large`
        lim = self.info["limits"]
        too_large = cairn_client.TooLarge
        # a prompt longer than the context
        self.expect_call_error("generate", {"tokens": [1] + [300] * self.n_ctx}, too_large)
        self.expect_call_error("generate", {"prompt": "the cat sat. " * self.n_ctx}, too_large)
        self.expect_call_error("generate", {"prompt": "hi", "max_tokens": 100 * self.n_ctx},
                               too_large)
        self.expect_call_error("generate", {"prompt": "hi", "stop": ["x"] * (lim["max_stop"] + 1)},
                               too_large)
        self.expect_call_error("generate", {"prompt": "hi", "stop": ["x" * 10000]}, too_large)
        self.expect_call_error("session.open", {"tokens": [1] + [300] * self.n_ctx}, too_large)
        # too many map keys, too deep
        self.expect_error_or_close(
            request("generate", [{f"k{i}": i for i in range(lim["max_map_len"] + 1)}]),
            ("too_large",))
        deep = 1
        for _ in range(lim["max_depth"] + 2):
            deep = [deep]
        self.expect_error_or_close(request("generate", [{"prompt": "hi", "x": deep}]),
                                   ("too_large",))

    def test_huge_string_and_message(self):
        lim = self.info["limits"]
        # a string over the string limit inside a message under the message
        # limit (the defaults: 4 MiB and 8 MiB)
        self.assertLess(lim["max_string_bytes"] + 1024, lim["max_message_bytes"])
        self.expect_error_or_close(
            request("generate", [{"prompt": "a" * (lim["max_string_bytes"] + 1)}]),
            ("too_large",))
        # a string over both limits
        self.expect_error_or_close(
            request("tokenize", [{"text": "b" * (lim["max_message_bytes"] + 1)}]), ("too_large",))
        # a message over the message limit made of strings under the string limit
        piece = "c" * (lim["max_string_bytes"] - 16)
        n = lim["max_message_bytes"] // len(piece) + 1
        self.assertLessEqual(n, lim["max_stop"])
        e = self.expect_error_or_close(request("generate", [{"prompt": "hi", "stop": [piece] * n}]),
                                       ("too_large",))
        self.assertIn("max_message_bytes", e["message"])
        # a header claiming 2^31 elements (or bytes) with nothing behind it:
        # refused at once from the claim, and nothing allocated for it
        self.expect_error_or_close(
            b"\x94\x00\x07\xa8generate\x91\x81\xa6tokens\xdd\x7f\xff\xff\xff",
            ("too_large",), allow_close=False, half_close=True)
        self.expect_error_or_close(
            b"\x94\x00\x07\xa8generate\x91\x81\xa6prompt\xdb\x7f\xff\xff\xff",
            ("too_large",), allow_close=False, half_close=True)
        self.expect_error_or_close(b"\xdd\xff\xff\xff\xff", ("too_large", "invalid_request"),
                                   msgid=None, half_close=True)

    def test_half_a_message_then_close(self):
        data = request("generate", [{"prompt": "Once upon a time", "max_tokens": 8}])
        s = harness.connect(self.addr())
        s.sendall(data[: len(data) // 2])
        s.close()


# --------------------------------------------------------------------------
class UnixSocket(ServerCase):
    def test_socket_file_mode(self):
        st = os.stat(self.sock_path)
        self.assertTrue(stat.S_ISSOCK(st.st_mode))
        self.assertEqual(stat.S_IMODE(st.st_mode), 0o600)

    def test_generate_over_unix_socket(self):
        with self.new_client(unix=True) as u:
            self.assertEqual(u.info()["page_size"], self.P)
            p, n = PROMPTS[6], 24
            items = list(u.generate(prompt=p, max_tokens=n, temperature=0, stream=True))
            self.assertEqual(items[-1].text, cairn_run_greedy(p, n)[0])
            self.assertEqual("".join(d.text for d in items[:-1]), items[-1].text)
            # sessions are server-wide: one opened over the socket is seen over TCP
            sid = u.session_open(text=p)["session_id"]
            self.assertEqual(self.c.session_info(sid)["n_tokens"], len(self.tok(p, True)))
            u.session_close(sid)

    def test_garbage_on_unix_socket(self):
        msgs, closed = raw_exchange(self.sock_path, b"\xc1\xc1\xc1" + request("nope", [{}]))
        for m in msgs:
            if isinstance(m, list) and m and m[0] == 1:
                self.assertIsNotNone(m[2])
        with self.new_client(unix=True) as u:
            self.assertIn("model", u.info())


if __name__ == "__main__":
    harness.main()
