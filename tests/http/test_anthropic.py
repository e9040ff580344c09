#!/usr/bin/env python3
"""Anthropic's Messages API (POST /v1/messages, docs/anthropic.md) driven by
the official `anthropic` Python package against the real `cairn serve` on
the bundled model.

usage: test_anthropic.py CAIRN_BIN MODEL [unittest args...]

Covers: messages.create (text, stop reasons max_tokens / stop_sequence /
end_turn, usage with cache_read_input_tokens on a repeated prompt), system
as a string and as text blocks, streaming (text_stream and the raw events,
assembling to the non-streamed message), a forced tool_use (tool_choice
tool / any) whose input validates against the tool's input_schema,
streamed as input_json_delta, then its tool_result (string and block
content, is_error) sent back, and the errors: missing max_tokens, fields out
of range, unsupported blocks, Anthropic's error shape and x-api-key /
Bearer authentication.

Exits 77 (skipped) when the `anthropic` package cannot be imported
(scripts/setup.sh --test installs it).
"""
import json
import os
import sys
import unittest
import urllib.error
import urllib.request

try:
    import anthropic
except ImportError as e:
    print(f"skipped: the anthropic package cannot be imported ({e}); "
          "scripts/setup.sh --test installs it")
    sys.exit(77)
import jsonschema

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import SHORT_HANG_GUARD_S, Server  # noqa: E402

CAIRN, MODEL = harness.take_argv("CAIRN_BIN", "MODEL", usage=__doc__)

TOKEN = "anthropic-test-token-0123456789"
PAGE = 16

WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "input_schema": {"type": "object",
                     "properties": {"city": {"type": "string", "maxLength": 24},
                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                     "required": ["city", "unit"]},
}
CLOCK = {"name": "get_time", "input_schema": {
    "type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"]}}


def sampling(kw):
    """The sampling fields moved into extra_body: the current client has no
    parameters for them (older ones had; the server takes them either way)."""
    extra = dict(kw.pop("extra_body", None) or {})
    for k in ("temperature", "top_p", "top_k", "seed"):
        if k in kw:
            extra[k] = kw.pop(k)
    if extra:
        kw["extra_body"] = extra
    return kw


def text_of(msg):
    return "".join(b.text for b in msg.content if b.type == "text")


def raw_post(url, body, headers=None):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=SHORT_HANG_GUARD_S) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


class Messages(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server(CAIRN, ["-m", MODEL], http=True, start_timeout=SHORT_HANG_GUARD_S)
        cls.client = anthropic.Anthropic(base_url=cls.server.http_url, api_key="unused",
                                         max_retries=0, timeout=SHORT_HANG_GUARD_S)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop()

    def create(self, messages, **kw):
        kw.setdefault("model", "stories260K")
        kw.setdefault("max_tokens", 24)
        return self.client.messages.create(messages=messages, **sampling(kw))

    def test_create(self):
        msgs = [{"role": "user", "content": "Tell me about a dog named Rex."}]
        m = self.create(msgs, temperature=0, metadata={"user_id": "u-1"})
        self.assertEqual((m.type, m.role, m.model), ("message", "assistant", "stories260K"))
        self.assertTrue(m.id.startswith("msg_"))
        self.assertEqual([b.type for b in m.content], ["text"])
        self.assertTrue(m.content[0].text)
        # greedy: the story runs past the 24-token budget
        self.assertEqual(m.stop_reason, "max_tokens")
        self.assertEqual(m.usage.output_tokens, 24)
        self.assertIsNone(m.stop_sequence)
        self.assertGreater(m.usage.input_tokens, 0)
        self.assertEqual(m.usage.cache_creation_input_tokens, 0)
        # the same prompt again: its whole pages are read from the cache, and
        # Anthropic's input_tokens counts only what was computed
        again = self.create(msgs, temperature=0)
        total = again.usage.input_tokens + again.usage.cache_read_input_tokens
        self.assertEqual(total, m.usage.input_tokens + m.usage.cache_read_input_tokens)
        self.assertGreaterEqual(again.usage.cache_read_input_tokens, (total - 1) // PAGE * PAGE)
        self.assertEqual(text_of(again), text_of(m))

    def test_system_string_and_blocks(self):
        msgs = [{"role": "user", "content": [{"type": "text", "text": "A story "},
                                             {"type": "text", "text": "about a cat."}]}]
        a = self.create(msgs, system="Cats! You tell stories.", temperature=0)
        b = self.create(msgs, system=[{"type": "text", "text": "Cats! You tell "},
                                      {"type": "text", "text": "stories."}], temperature=0)
        c = self.create([{"role": "user", "content": "A story about a cat."}],
                        system="Cats! You tell stories.", temperature=0)
        self.assertEqual(text_of(a), text_of(b))
        self.assertEqual(text_of(a), text_of(c))
        self.assertEqual(a.usage.input_tokens + a.usage.cache_read_input_tokens,
                         c.usage.input_tokens + c.usage.cache_read_input_tokens)

    def test_prefill_is_continued(self):
        """A last assistant message is a prefill: the reply continues its
        text (the chat route's continue_final_message), string or blocks."""
        msgs = [{"role": "user", "content": "Tell me a story."},
                {"role": "assistant", "content": "Once upon a time, there was"}]
        m = self.create(msgs, temperature=0, max_tokens=12)
        blocks = self.create([msgs[0], {"role": "assistant", "content": [
            {"type": "text", "text": "Once upon a time, there was"}]}], temperature=0,
            max_tokens=12)
        status, chat = raw_post(self.server.http_url + "/v1/chat/completions",
                                {"messages": msgs, "max_tokens": 12, "temperature": 0})
        self.assertEqual(status, 200, chat)
        self.assertEqual(text_of(m), chat["choices"][0]["message"]["content"])
        self.assertEqual(text_of(blocks), text_of(m))

    def test_stop_sequence(self):
        msgs = [{"role": "user", "content": "Once upon a time"}]
        full = text_of(self.create(msgs, max_tokens=40, temperature=0))
        words = full.split()
        self.assertGreater(len(words), 3, full)
        stop = words[2]
        m = self.create(msgs, max_tokens=40, temperature=0, stop_sequences=["zzqx", stop])
        self.assertEqual(m.stop_reason, "stop_sequence")
        self.assertEqual(m.stop_sequence, stop)
        self.assertTrue(full.startswith(text_of(m)))
        self.assertNotIn(stop, text_of(m))

    def test_stream(self):
        msgs = [{"role": "user", "content": "Tell me about a bird."}]
        whole = self.create(msgs, max_tokens=30, temperature=0)
        with self.client.messages.stream(**sampling(dict(model="m", max_tokens=30, temperature=0,
                                                         messages=msgs))) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        self.assertEqual(text, text_of(whole))
        self.assertEqual(text_of(final), text_of(whole))
        self.assertEqual(final.stop_reason, whole.stop_reason)
        self.assertEqual(final.usage.output_tokens, whole.usage.output_tokens)
        # the raw events, in Anthropic's order
        events = list(self.create(msgs, max_tokens=30, temperature=0, stream=True))
        kinds = [e.type for e in events]
        self.assertEqual(kinds[:2], ["message_start", "content_block_start"])
        self.assertEqual(kinds[-3:], ["content_block_stop", "message_delta", "message_stop"])
        self.assertTrue(all(k == "content_block_delta" for k in kinds[2:-3]))
        self.assertEqual(events[0].message.id[:4], "msg_")
        self.assertEqual("".join(e.delta.text for e in events[2:-3]), text_of(whole))
        self.assertEqual(events[-2].delta.stop_reason, whole.stop_reason)
        self.assertEqual(events[-2].usage.output_tokens, whole.usage.output_tokens)

    def test_stream_has_ping(self):
        req = urllib.request.Request(
            self.server.http_url + "/v1/messages", method="POST",
            data=json.dumps({"model": "m", "max_tokens": 3, "stream": True,
                             "messages": [{"role": "user", "content": "Hi"}]}).encode())
        with urllib.request.urlopen(req, timeout=SHORT_HANG_GUARD_S) as r:
            self.assertEqual(r.headers["Content-Type"], "text/event-stream")
            body = r.read().decode()
        names = [line[7:] for line in body.splitlines() if line.startswith("event: ")]
        self.assertEqual(names[:2], ["message_start", "ping"])
        self.assertEqual(names[-1], "message_stop")
        self.assertNotIn("[DONE]", body)

    def test_tool_use_round_trip(self):
        ask = [{"role": "user", "content": "What is the weather in Paris?"}]
        for seed in range(3):
            with self.subTest(seed=seed):
                m = self.create(ask, tools=[WEATHER, CLOCK], max_tokens=200, temperature=1.0,
                                tool_choice={"type": "tool", "name": "get_weather"},
                                seed=seed)
                self.assertEqual(m.stop_reason, "tool_use", m)
                uses = [b for b in m.content if b.type == "tool_use"]
                self.assertEqual(len(uses), 1)
                self.assertEqual(uses[0].name, "get_weather")
                self.assertTrue(uses[0].id.startswith("toolu_"))
                jsonschema.validate(uses[0].input, WEATHER["input_schema"])
        # "any": a call of one of the tools
        m = self.create(ask, tools=[WEATHER, CLOCK], max_tokens=200, temperature=0,
                        tool_choice={"type": "any", "disable_parallel_tool_use": True})
        self.assertEqual(m.stop_reason, "tool_use")
        use = [b for b in m.content if b.type == "tool_use"][0]
        self.assertIn(use.name, ("get_weather", "get_time"))
        # streamed: the same call, its input as input_json_delta
        forced = dict(tools=[WEATHER], max_tokens=200, temperature=0,
                      tool_choice={"type": "tool", "name": "get_weather"})
        whole = self.create(ask, **forced)
        events = list(self.create(ask, stream=True, **forced))
        starts = [e for e in events if e.type == "content_block_start"]
        self.assertEqual([s.content_block.type for s in starts][-1], "tool_use")
        args = "".join(e.delta.partial_json for e in events if e.type == "content_block_delta"
                       and e.delta.type == "input_json_delta")
        tool = [b for b in whole.content if b.type == "tool_use"][0]
        self.assertEqual(json.loads(args), tool.input)
        self.assertEqual(starts[-1].content_block.name, "get_weather")
        self.assertEqual([e for e in events if e.type == "message_delta"][0].delta.stop_reason,
                         "tool_use")
        with self.client.messages.stream(model="m", messages=ask, **sampling(dict(forced))) as s:
            final = s.get_final_message()
        self.assertEqual([b.input for b in final.content if b.type == "tool_use"], [tool.input])
        # the call and its result go back: the conversation continues
        history = ask + [{"role": "assistant", "content": [b.model_dump() for b in whole.content]}]
        for result in ("sunny, 18 C", [{"type": "text", "text": "sunny, "},
                                       {"type": "text", "text": "18 C"}]):
            with self.subTest(result=result):
                r = self.create(history + [{"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": tool.id, "content": result},
                    {"type": "text", "text": "And tomorrow?"}]}], tools=[WEATHER],
                    temperature=0, max_tokens=12)
                self.assertIn(r.stop_reason, ("end_turn", "max_tokens", "tool_use"))
        # the two forms of the result render the same prompt
        tokens = [self.create(history + [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tool.id, "content": c}]}], tools=[WEATHER],
            temperature=0, max_tokens=1).usage for c in ("sunny", [{"type": "text",
                                                                     "text": "sunny"}])]
        self.assertEqual(*[u.input_tokens + u.cache_read_input_tokens for u in tokens])
        # an error result says so in the prompt: more tokens than without
        err = self.create(history + [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tool.id, "content": "sunny",
             "is_error": True}]}], tools=[WEATHER], temperature=0, max_tokens=1).usage
        self.assertGreater(err.input_tokens + err.cache_read_input_tokens,
                           tokens[0].input_tokens + tokens[0].cache_read_input_tokens)

    def test_errors(self):
        url = self.server.http_url + "/v1/messages"
        ok = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}]}
        bad = [
            ({"max_tokens": None}, "max_tokens"),
            ({"max_tokens": 0}, "max_tokens"),
            ({"max_tokens": 10 ** 9}, "max_tokens"),
            ({"temperature": 3}, "temperature"),
            ({"top_k": -1}, "top_k"),
            ({"stop_sequences": "x"}, "stop_sequences"),
            ({"stop_sequences": [""]}, "stop_sequences"),
            ({"messages": []}, "messages"),
            ({"messages": [{"role": "system", "content": "x"}]}, "role"),
            ({"messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": "AA=="}}]}]}, "image"),
            ({"system": 5}, "system"),
            ({"tools": [{"name": "x"}]}, "input_schema"),
            ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "client tools"),
            ({"tools": [WEATHER], "tool_choice": {"type": "tool"}}, "tool_choice"),
            ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "not in"),
        ]
        for change, words in bad:
            body = {**ok, **change}
            body = {k: v for k, v in body.items() if v is not None}
            with self.subTest(change=change):
                status, out = raw_post(url, body)
                self.assertEqual(status, 400, out)
                self.assertEqual(out["type"], "error")
                self.assertEqual(out["error"]["type"], "invalid_request_error")
                self.assertIn(words, out["error"]["message"])
        # the client raises Anthropic's exception with the message
        with self.assertRaises(anthropic.BadRequestError) as cm:
            self.create([{"role": "user", "content": "x"}], temperature=5)
        self.assertIn("temperature", str(cm.exception))
        # not JSON
        req = urllib.request.Request(url, data=b"{nope", method="POST")
        with self.assertRaises(urllib.error.HTTPError) as cm:
            urllib.request.urlopen(req, timeout=SHORT_HANG_GUARD_S)
        self.assertEqual(cm.exception.code, 400)
        self.assertEqual(json.loads(cm.exception.read())["type"], "error")
        # the server still answers afterwards
        self.assertEqual(raw_post(url, ok)[0], 200)


class Auth(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server(CAIRN, ["-m", MODEL, "--auth-token", TOKEN], http=True,
                            start_timeout=SHORT_HANG_GUARD_S)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_x_api_key_and_bearer(self):
        msgs = [{"role": "user", "content": "Hi"}]
        # the client sends x-api-key (and anthropic-version, which is ignored)
        with anthropic.Anthropic(base_url=self.server.http_url, api_key=TOKEN,
                                 max_retries=0) as good:
            self.assertEqual(good.messages.create(model="m", max_tokens=2, messages=msgs)
                             .usage.output_tokens, 2)
        with anthropic.Anthropic(base_url=self.server.http_url, auth_token=TOKEN,
                                 max_retries=0) as bearer:
            self.assertEqual(bearer.messages.create(model="m", max_tokens=2, messages=msgs)
                             .usage.output_tokens, 2)
        with anthropic.Anthropic(base_url=self.server.http_url, api_key="wrong",
                                 max_retries=0) as bad:
            with self.assertRaises(anthropic.AuthenticationError) as cm:
                bad.messages.create(model="m", max_tokens=2, messages=msgs)
        self.assertEqual(cm.exception.body["type"], "error")
        self.assertEqual(cm.exception.body["error"]["type"], "authentication_error")
        status, out = raw_post(self.server.http_url + "/v1/messages",
                               {"model": "m", "max_tokens": 2, "messages": msgs})
        self.assertEqual((status, out["error"]["type"]), (401, "authentication_error"))
        # x-api-key reaches the OpenAI routes too
        status, _ = raw_post(self.server.http_url + "/v1/completions",
                             {"prompt": "Once", "max_tokens": 2}, {"x-api-key": TOKEN})
        self.assertEqual(status, 200)


if __name__ == "__main__":
    harness.main()
