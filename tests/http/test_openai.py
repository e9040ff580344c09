#!/usr/bin/env python3
"""The OpenAI-compatible HTTP facade (docs/openai.md) driven by the official
`openai` Python package against the real `cairn serve` on the bundled model.

usage: test_openai.py CAIRN_BIN MODEL [unittest args...]

Covers: /v1/models, chat and text completions (non-streaming, streaming
chunks that concatenate to the greedy non-streaming text, include_usage),
cached_tokens on the second turn of a conversation (with and without a
session key), session affinity by body field and by header (including an
edited history, which truncates the session), structured output
(json_schema validated with jsonschema over several seeds, json_object, a
bad schema), tools accepted, a malformed tool schema refused (400 naming
tools[i].function.parameters, whatever tool_choice), and the 400s for
unsupported fields.
"""
import json
import os
import re
import subprocess
import sys
import unittest
import urllib.request

import jsonschema
import openai

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import SHORT_HANG_GUARD_S, Server  # noqa: E402
from metrics import parse_metrics  # noqa: E402  (tests/http/metrics.py)

CAIRN, MODEL = harness.take_argv("CAIRN_BIN", "MODEL", usage=__doc__)

PAGE = 16  # serve's default page size: cached prefixes come in whole pages

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}


def whole_pages(n):
    return n // PAGE * PAGE


class OpenAIFacade(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server(CAIRN, ["-m", MODEL], http=True, start_timeout=SHORT_HANG_GUARD_S)
        cls.client = openai.OpenAI(base_url=cls.server.http_url + "/v1", api_key="unused",
                                   max_retries=0, timeout=SHORT_HANG_GUARD_S)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop()

    def chat(self, messages, **kw):
        kw.setdefault("model", "stories260K")
        return self.client.chat.completions.create(messages=messages, **kw)

    def test_models(self):
        models = self.client.models.list()
        self.assertEqual([m.id for m in models.data], ["stories260K"])
        self.assertEqual(self.client.models.retrieve("stories260K").id, "stories260K")
        with self.assertRaises(openai.NotFoundError):
            self.client.models.retrieve("gpt-4")

    def test_chat_stream_matches_non_stream(self):
        msgs = [{"role": "system", "content": "You tell stories."},
                {"role": "user", "content": "Tell me about a dog named Max."}]
        full = self.chat(msgs, max_tokens=40, temperature=0)
        self.assertEqual(full.object, "chat.completion")
        choice = full.choices[0]
        self.assertEqual(choice.message.role, "assistant")
        self.assertIn(choice.finish_reason, ("stop", "length"))
        self.assertTrue(choice.message.content)
        self.assertEqual(full.usage.total_tokens,
                         full.usage.prompt_tokens + full.usage.completion_tokens)
        self.assertIsNotNone(full.usage.prompt_tokens_details.cached_tokens)

        chunks = list(self.chat(msgs, max_tokens=40, temperature=0, stream=True,
                                stream_options={"include_usage": True}))
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(text, choice.message.content)
        finals = [c.choices[0].finish_reason for c in chunks if c.choices]
        self.assertEqual(finals[-1], choice.finish_reason)
        self.assertTrue(all(f is None for f in finals[:-1]))
        usage = chunks[-1]
        self.assertEqual(usage.choices, [])
        self.assertEqual(usage.usage.completion_tokens, full.usage.completion_tokens)
        self.assertEqual(usage.usage.prompt_tokens, full.usage.prompt_tokens)
        # the same prompt again: its whole pages come from the cache
        self.assertGreaterEqual(usage.usage.prompt_tokens_details.cached_tokens,
                                whole_pages(full.usage.prompt_tokens - 1))
        self.assertTrue(all(c.usage is None for c in chunks[:-1]))

    def test_stream_without_usage(self):
        chunks = list(self.chat([{"role": "user", "content": "Hi"}], max_tokens=5,
                                temperature=0, stream=True))
        self.assertTrue(all(c.usage is None and c.choices for c in chunks))

    def test_completions(self):
        full = self.client.completions.create(model="stories260K", prompt="Once upon a time",
                                              max_tokens=30, temperature=0)
        self.assertEqual(full.object, "text_completion")
        self.assertEqual(full.usage.completion_tokens, 30)
        self.assertEqual(full.choices[0].finish_reason, "length")
        chunks = list(self.client.completions.create(
            model="stories260K", prompt="Once upon a time", max_tokens=30, temperature=0,
            stream=True, stream_options={"include_usage": True}))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        self.assertEqual(text, full.choices[0].text)
        self.assertEqual(chunks[-1].usage.completion_tokens, 30)
        # a stop string ends it before the string
        words = full.choices[0].text.split()
        cut = self.client.completions.create(model="stories260K", prompt="Once upon a time",
                                             max_tokens=30, temperature=0, stop=[words[2]])
        self.assertEqual(cut.choices[0].finish_reason, "stop")
        self.assertNotIn(words[2], cut.choices[0].text)
        self.assertTrue(full.choices[0].text.startswith(cut.choices[0].text))

    def test_seeded_sampling_repeats(self):
        a = self.chat([{"role": "user", "content": "A story"}], max_tokens=20, seed=42,
                      temperature=1.0)
        b = self.chat([{"role": "user", "content": "A story"}], max_tokens=20, seed=42,
                      temperature=1.0)
        self.assertEqual(a.choices[0].message.content, b.choices[0].message.content)

    def conversation(self, animal, **kw):
        """Two turns, the second resending the whole history. The system
        prompt starts with the animal, so no other test shares a prefix."""
        first_user = f"Tell me about a {animal}."
        msgs = [{"role": "system",
                 "content": f"{animal.capitalize()}s! You are a storyteller for children."},
                {"role": "user", "content": first_user}]
        one = self.chat(msgs, max_tokens=24, temperature=0, **kw)
        msgs += [{"role": "assistant", "content": one.choices[0].message.content},
                 {"role": "user", "content": "And then what happened to them?"}]
        two = self.chat(msgs, max_tokens=24, temperature=0, **kw)
        return msgs, one, two

    def test_second_turn_cached_without_session(self):
        _, one, two = self.conversation("fox")
        self.assertLess(one.usage.prompt_tokens_details.cached_tokens, PAGE)
        self.assertGreater(two.usage.prompt_tokens, one.usage.prompt_tokens)
        # the resent history was not recomputed, to the token: the first
        # prompt and the reply (but its last token, sampled and never fed
        # back) are cached; only the new turn is computed
        self.assertResentCached(one, two)

    def assertResentCached(self, one, two):
        history = one.usage.prompt_tokens + one.usage.completion_tokens
        self.assertGreaterEqual(two.usage.prompt_tokens_details.cached_tokens, history - 1,
                                f"turn 1: {one.usage}, turn 2: {two.usage}")

    def sessions_open(self):
        with urllib.request.urlopen(self.server.http_url + "/metrics") as r:
            return parse_metrics(r.read().decode())[0]["cairn_sessions"]

    def test_session_affinity_body_and_header(self):
        before = self.sessions_open()
        for animal, kw in (("zebra", {"extra_body": {"session_id": "conv-body-1"}}),
                           ("yak", {"extra_body": {"prompt_cache_key": "conv-key-1"}}),
                           ("walrus", {"extra_headers": {"X-Session-Id": "conv-header-1"}})):
            with self.subTest(**{k: str(v) for k, v in kw.items()}):
                msgs, one, two = self.conversation(animal, **kw)
                self.assertLess(one.usage.prompt_tokens_details.cached_tokens, PAGE)
                self.assertResentCached(one, two)
                # same answer as without a session: the session is only a cache
                plain = self.chat(msgs, max_tokens=24, temperature=0)
                self.assertEqual(plain.choices[0].message.content,
                                 two.choices[0].message.content)
                # an edited history (the assistant's reply changed) truncates
                # the session to the common prefix and still answers the same
                # as a fresh request would
                edited = msgs[:2] + [{"role": "assistant", "content": "Something else."},
                                     msgs[3]]
                three = self.chat(edited, max_tokens=24, temperature=0, **kw)
                fresh = self.chat(edited, max_tokens=24, temperature=0)
                self.assertEqual(three.choices[0].message.content,
                                 fresh.choices[0].message.content)
                self.assertGreaterEqual(three.usage.prompt_tokens_details.cached_tokens,
                                        whole_pages(one.usage.prompt_tokens) - PAGE)
        # one engine session per key, reused across its turns
        self.assertEqual(self.sessions_open(), before + 3)

    def test_json_schema(self):
        schema = {
            "type": "object",
            "properties": {
                "mood": {"enum": ["happy", "sad", "sleepy"]},
                "age": {"type": "integer"},
                "likes_cats": {"type": "boolean"},
            },
            "required": ["mood", "age", "likes_cats"],
            "additionalProperties": False,
        }
        for seed in range(5):
            r = self.chat([{"role": "user", "content": "Describe the girl as JSON."}],
                          max_tokens=200, temperature=1.0, seed=seed,
                          response_format={"type": "json_schema",
                                           "json_schema": {"name": "girl", "schema": schema,
                                                           "strict": True}})
            with self.subTest(seed=seed):
                self.assertEqual(r.choices[0].finish_reason, "stop")
                jsonschema.validate(json.loads(r.choices[0].message.content), schema)

    def test_json_object(self):
        r = self.chat([{"role": "user", "content": "Give me JSON."}], max_tokens=300,
                      temperature=0.5, seed=1, response_format={"type": "json_object"})
        text = r.choices[0].message.content
        self.assertTrue(text.lstrip().startswith("{"), text)
        if r.choices[0].finish_reason == "stop":
            self.assertIsInstance(json.loads(text), dict)

    def test_bad_schema_is_400(self):
        with self.assertRaises(openai.BadRequestError) as cm:
            self.chat([{"role": "user", "content": "x"}], max_tokens=5,
                      response_format={"type": "json_schema",
                                       "json_schema": {"name": "x", "schema": {
                                           "type": "string", "pattern": "(?=a)"}}})
        self.assertIn("pattern", str(cm.exception))
        self.assertEqual(cm.exception.body["param"], "response_format")

    def test_tools_accepted(self):
        for choice in ("auto", "none", "required",
                       {"type": "function", "function": {"name": "get_weather"}}):
            with self.subTest(tool_choice=choice):
                r = self.chat([{"role": "user", "content": "Weather in Paris?"}],
                              tools=[WEATHER_TOOL], tool_choice=choice, max_tokens=10,
                              temperature=0)
                self.assertIn(r.choices[0].finish_reason, ("stop", "length", "tool_calls"))
        # a whole tool-call round trip in the history is accepted too
        r = self.chat([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 18 C"}],
            tools=[WEATHER_TOOL], max_tokens=10, temperature=0)
        self.assertTrue(r.choices[0].finish_reason)
        with self.assertRaises(openai.BadRequestError):
            self.chat([{"role": "user", "content": "x"}], tools=[{"type": "function"}])
        with self.assertRaises(openai.BadRequestError):
            self.chat([{"role": "user", "content": "x"}], tools=[WEATHER_TOOL],
                      tool_choice={"type": "function", "function": {"name": "nope"}})

    def test_malformed_tool_schema_is_400(self):
        """A tool whose parameters schema is malformed is refused when the
        request arrives, whatever tool_choice says (as a response_format
        schema is), naming the tool; one the grammar merely does not support
        (minimum) is accepted."""
        def tool(name, parameters):
            return {"type": "function", "function": {"name": name, "parameters": parameters}}
        bad = {
            "properties": ({"type": "object", "properties": "nope"}, "'properties' must be"),
            "dangling $ref": ({"type": "object", "properties": {"when": {
                "$ref": "#/$defs/Missing"}}}, "#/$defs/Missing"),
        }
        msgs = [{"role": "user", "content": "Weather in Paris?"}]
        for shape, (schema, why) in bad.items():
            for choice in ("auto", "required", "none",
                           {"type": "function", "function": {"name": "broken"}}):
                for stream in (False, True):
                    with self.subTest(shape=shape, tool_choice=choice, stream=stream):
                        with self.assertRaises(openai.BadRequestError) as cm:
                            r = self.chat(msgs, tools=[WEATHER_TOOL, tool("broken", schema)],
                                          tool_choice=choice, max_tokens=5, stream=stream)
                            list(r) if stream else None
                        self.assertEqual(cm.exception.status_code, 400)
                        self.assertEqual(cm.exception.body["param"], "tools[1].function.parameters")
                        self.assertIn(why, cm.exception.body["message"])
                        self.assertIn("tools[1].function.parameters", cm.exception.body["message"])
        # the same schema in response_format is refused the same way
        with self.assertRaises(openai.BadRequestError) as cm:
            self.chat(msgs, max_tokens=5, response_format={"type": "json_schema", "json_schema": {
                "name": "x", "schema": bad["properties"][0]}})
        self.assertEqual(cm.exception.body["param"], "response_format")
        # valid, beyond the grammar: accepted, forced with object arguments
        volume = tool("volume", {"type": "object", "properties": {
            "level": {"type": "integer", "minimum": 0}}})
        r = self.chat(msgs, tools=[volume], tool_choice="required", max_tokens=60, temperature=0)
        self.assertIn(r.choices[0].finish_reason, ("tool_calls", "length"))
        # the server goes on serving
        self.assertTrue(self.chat(msgs, tools=[WEATHER_TOOL], max_tokens=3).choices)

    def test_forced_tool_calls(self):
        """tool_choice "required" or a named function forces a call on a model
        that was never trained to make one: every reply, whatever the seed,
        is a call of an offered tool whose arguments validate against its
        parameters (nested $defs included), streamed or not."""
        weather = json.loads(json.dumps(WEATHER_TOOL))
        weather["function"]["parameters"]["properties"]["city"]["maxLength"] = 24
        book = {"type": "function", "function": {"name": "book_table", "parameters": {
            "type": "object",
            "properties": {"when": {"$ref": "#/$defs/Slot"},
                           "guests": {"type": "integer"}},
            "required": ["when", "guests"],
            "$defs": {"Slot": {"type": "object",
                               "properties": {"day": {"enum": ["mon", "tue", "wed"]},
                                              "hour": {"type": "integer"}},
                               "required": ["day", "hour"]}}}}}
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (weather, book)}
        msgs = [{"role": "user", "content": "Weather in Paris?"}]

        def check(calls, allowed):
            self.assertTrue(calls)
            for c in calls:
                self.assertIn(c.function.name, allowed)
                jsonschema.validate(json.loads(c.function.arguments), schemas[c.function.name])

        named = {"type": "function", "function": {"name": "book_table"}}
        for seed in range(4):
            for choice, allowed in (("required", ("get_weather", "book_table")),
                                    (named, ("book_table",))):
                with self.subTest(seed=seed, tool_choice=choice):
                    r = self.chat(msgs, tools=[weather, book], tool_choice=choice,
                                  max_tokens=300, temperature=1.0, seed=seed,
                                  parallel_tool_calls=False)
                    self.assertEqual(r.choices[0].finish_reason, "tool_calls",
                                     r.choices[0].message)
                    check(r.choices[0].message.tool_calls, allowed)
        # parallel calls (the default for "required"): one or more calls,
        # each valid, unless max_tokens cut the list short: then "length",
        # the complete calls kept and nothing of the broken one as content
        for seed in range(3):
            r = self.chat(msgs, tools=[weather, book], tool_choice="required", max_tokens=300,
                          temperature=1.0, seed=seed)
            with self.subTest(seed=seed, parallel=True):
                if r.choices[0].finish_reason == "tool_calls":
                    check(r.choices[0].message.tool_calls, ("get_weather", "book_table"))
                else:
                    self.assertEqual(r.choices[0].finish_reason, "length")
                    self.assertFalse(r.choices[0].message.content, r.choices[0].message)
                    if r.choices[0].message.tool_calls:
                        check(r.choices[0].message.tool_calls, ("get_weather", "book_table"))
        # streamed: the deltas assemble to the same call as the whole reply
        whole = self.chat(msgs, tools=[weather, book], tool_choice=named, max_tokens=300,
                          temperature=0)
        parts, finish = {}, None
        for ch in self.chat(msgs, tools=[weather, book], tool_choice=named, max_tokens=300,
                            temperature=0, stream=True):
            for d in ch.choices[0].delta.tool_calls or []:
                p = parts.setdefault(d.index, {"name": "", "arguments": ""})
                p["name"] += d.function.name or ""
                p["arguments"] += d.function.arguments or ""
            finish = ch.choices[0].finish_reason or finish
        self.assertEqual(finish, "tool_calls")
        self.assertEqual([(p["name"], p["arguments"]) for _, p in sorted(parts.items())],
                         [(c.function.name, c.function.arguments)
                          for c in whole.choices[0].message.tool_calls])
        # a parameters schema beyond the grammar's subset: the call is still
        # forced, its arguments only constrained to an object
        volume = {"type": "function", "function": {"name": "set_volume", "parameters": {
            "type": "object", "properties": {"level": {"type": "integer", "multipleOf": 5}},
            "required": ["level"], "additionalProperties": False}}}
        r = self.chat(msgs, tools=[volume], tool_choice="required", max_tokens=300,
                      temperature=0)
        if r.choices[0].finish_reason == "tool_calls":
            for c in r.choices[0].message.tool_calls:
                self.assertEqual(c.function.name, "set_volume")
                self.assertIsInstance(json.loads(c.function.arguments), dict)
        else:
            self.assertEqual(r.choices[0].finish_reason, "length")
        # tools first: a forced turn is the call, the response_format waits
        # for the final answer
        r = self.chat(msgs, tools=[weather], tool_choice="required", max_tokens=300,
                      temperature=0, parallel_tool_calls=False,
                      response_format={"type": "json_object"})
        check(r.choices[0].message.tool_calls, ("get_weather",))

    def test_tools_with_response_format(self):
        """tool_choice auto with a JSON schema response_format: each reply is
        a call of an offered tool (arguments valid) or the final answer
        valid against the schema, never anything else."""
        answer = {"type": "object", "properties": {
            "summary": {"type": "string", "maxLength": 20},
            "score": {"$ref": "#/$defs/Score"}},
            "required": ["summary", "score"], "additionalProperties": False,
            "$defs": {"Score": {"type": "integer", "minimum": 0, "maximum": 9}}}
        tool_schema = WEATHER_TOOL["function"]["parameters"]
        kinds = set()
        for seed in range(8):
            with self.subTest(seed=seed):
                r = self.chat([{"role": "user", "content": "Weather in Paris?"}],
                              tools=[WEATHER_TOOL], max_tokens=120, temperature=1, seed=seed,
                              parallel_tool_calls=False, response_format={"type": "json_schema", "json_schema": {
                                  "name": "a", "schema": answer}})
                m = r.choices[0]
                if m.finish_reason == "tool_calls":
                    kinds.add("call")
                    for c in m.message.tool_calls:
                        self.assertEqual(c.function.name, "get_weather")
                        jsonschema.validate(json.loads(c.function.arguments), tool_schema)
                elif m.finish_reason == "stop":
                    kinds.add("answer")
                    jsonschema.validate(json.loads(m.message.content), answer)
        self.assertTrue(kinds, "every reply ran out of tokens: the check means nothing")
        print(f"\ntools + response_format over 8 seeds: {sorted(kinds)}", file=sys.stderr)

    def test_logit_bias(self):
        # the greedy first token of the prompt, by `cairn run -v`
        out = subprocess.run([CAIRN, "run", "-m", MODEL, "-p", "Once upon", "-n", "1",
                              "--temp", "0", "-v"], capture_output=True, text=True, timeout=60)
        first_id = int(re.findall(r"\[(\d+)\]", out.stdout + out.stderr)[0])
        kw = dict(model="m", prompt="Once upon", temperature=0, logprobs=2)
        base = self.client.completions.create(max_tokens=1, **kw).choices[0]
        alts = sorted(base.logprobs.top_logprobs[0].items(), key=lambda kv: -kv[1])
        self.assertEqual(alts[0][0], base.text)
        # banned: the runner-up comes first, its logprob still the model's own
        banned = self.client.completions.create(max_tokens=1, logit_bias={str(first_id): -100},
                                                **kw).choices[0]
        self.assertEqual(banned.text, alts[1][0])
        self.assertAlmostEqual(banned.logprobs.token_logprobs[0], alts[1][1], places=5)
        # forced: greedy repeats it (chat too)
        forced = self.client.completions.create(max_tokens=4, logit_bias={str(first_id): 100},
                                                **kw).choices[0]
        self.assertEqual(forced.text, base.text * 4)
        chat = self.chat([{"role": "user", "content": "Hi."}], max_tokens=3, temperature=0,
                         logit_bias={str(first_id): 100})
        self.assertEqual(chat.choices[0].message.content.strip(), (base.text * 3).strip())
        for bad in ({"x": 1}, {"-1": 1}, {"99999999": 1}, {"5": 101}, {"5": "a"}, [1],
                    {str(i): 1 for i in range(301)}):
            with self.subTest(logit_bias=bad):
                with self.assertRaises(openai.BadRequestError) as cm:
                    self.chat([{"role": "user", "content": "Hi."}], max_tokens=2,
                              logit_bias=bad)
                self.assertEqual(cm.exception.body["param"], "logit_bias")

    def test_n_choices(self):
        msgs = [{"role": "user", "content": "Tell me about a dog."}]
        r = self.chat(msgs, n=3, max_tokens=10, temperature=1.0, seed=7, logprobs=True)
        self.assertEqual([c.index for c in r.choices], [0, 1, 2])
        # choice i is what a single request with seed + i gives
        for i, c in enumerate(r.choices):
            one = self.chat(msgs, max_tokens=10, temperature=1.0, seed=7 + i)
            self.assertEqual(c.message.content, one.choices[0].message.content)
            self.assertEqual(len(c.logprobs.content), one.usage.completion_tokens)
        self.assertEqual(r.usage.prompt_tokens, one.usage.prompt_tokens)
        self.assertEqual(r.usage.completion_tokens,
                         sum(len(c.logprobs.content) for c in r.choices))
        self.assertGreater(len({c.message.content for c in r.choices}), 1)
        # streamed: chunks of every index, each assembling to its choice,
        # one usage chunk for the whole request
        parts, finishes, usage = {}, {}, None
        for ch in self.chat(msgs, n=3, max_tokens=10, temperature=1.0, seed=7, stream=True,
                            stream_options={"include_usage": True}):
            if ch.usage:
                usage = ch.usage
            for c in ch.choices:
                parts[c.index] = parts.get(c.index, "") + (c.delta.content or "")
                if c.finish_reason:
                    finishes[c.index] = c.finish_reason
        self.assertEqual([parts[i] for i in range(3)], [c.message.content for c in r.choices])
        self.assertEqual(sorted(finishes), [0, 1, 2])
        self.assertEqual(usage.completion_tokens, r.usage.completion_tokens)
        # completions too
        t = self.client.completions.create(model="m", prompt="Once upon", n=2, max_tokens=6,
                                           temperature=0)
        self.assertEqual([c.index for c in t.choices], [0, 1])
        self.assertEqual(t.choices[0].text, t.choices[1].text)  # greedy: the same
        # structured output holds for every choice
        fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}}}
        j = self.chat(msgs, n=3, max_tokens=20, temperature=1.0, seed=3, response_format=fmt)
        for c in j.choices:
            self.assertIsInstance(json.loads(c.message.content)["ok"], bool)

    def test_content_parts_and_developer_role(self):
        a = self.chat([{"role": "developer", "content": "Be brief."},
                       {"role": "user", "content": [{"type": "text", "text": "Hello "},
                                                    {"type": "text", "text": "there"}]}],
                      max_tokens=10, temperature=0)
        b = self.chat([{"role": "system", "content": "Be brief."},
                       {"role": "user", "content": "Hello there"}], max_tokens=10,
                      temperature=0)
        self.assertEqual(a.choices[0].message.content, b.choices[0].message.content)
        self.assertEqual(a.usage.prompt_tokens, b.usage.prompt_tokens)

    def test_logprobs(self):
        msgs = [{"role": "user", "content": "Tell me about a cat."}]
        r = self.chat(msgs, max_tokens=12, temperature=0, logprobs=True, top_logprobs=3)
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), r.usage.completion_tokens)
        self.assertEqual(b"".join(bytes(t.bytes) for t in content).decode(),
                         r.choices[0].message.content)
        for t in content:
            self.assertLessEqual(t.logprob, 0)
            self.assertEqual(len(t.top_logprobs), 3)
            # greedy: the chosen token is the most likely one
            self.assertEqual(t.top_logprobs[0].token, t.token)
            self.assertAlmostEqual(t.top_logprobs[0].logprob, t.logprob, places=5)
            alts = [a.logprob for a in t.top_logprobs]
            self.assertEqual(alts, sorted(alts, reverse=True))
        streamed = [t for c in self.chat(msgs, max_tokens=12, temperature=0, logprobs=True,
                                         stream=True)
                    if c.choices and c.choices[0].logprobs
                    for t in c.choices[0].logprobs.content]
        self.assertEqual([t.token for t in streamed], [t.token for t in content])
        for a, b in zip(streamed, content):
            self.assertAlmostEqual(a.logprob, b.logprob, places=5)
        # without logprobs there are none
        self.assertIsNone(self.chat(msgs, max_tokens=2).choices[0].logprobs)
        c = self.client.completions.create(model="m", prompt="Once upon", max_tokens=6,
                                           temperature=0, logprobs=2)
        lp = c.choices[0].logprobs
        self.assertEqual("".join(lp.tokens), c.choices[0].text)
        self.assertEqual(len(lp.token_logprobs), 6)
        self.assertEqual(lp.text_offset[0], 0)
        self.assertTrue(all(len(alt) <= 2 for alt in lp.top_logprobs))

    def test_assistant_prefill_is_continued(self):
        """A trailing assistant message is continued, not answered: the
        reply is what follows its text, exactly as a completion of the
        rendered conversation ending in that text (the bundled model has the
        generic <|role|> format). continue_final_message: false answers it
        with a new turn instead."""
        msgs = [{"role": "user", "content": "Tell me a story."},
                {"role": "assistant", "content": "Once upon a time, there was"}]
        rendered = "<|user|>\nTell me a story.\n<|assistant|>\nOnce upon a time, there was"
        kw = dict(model="m", max_tokens=12, temperature=0)
        got = self.chat(msgs, **kw)
        want = self.client.completions.create(prompt=rendered, **kw)
        self.assertEqual(got.choices[0].message.content, want.choices[0].text)
        self.assertEqual(got.usage.prompt_tokens, want.usage.prompt_tokens)

        new_turn = self.chat(msgs, extra_body={"continue_final_message": False}, **kw)
        want2 = self.client.completions.create(prompt=rendered + "\n<|assistant|>\n", **kw)
        self.assertEqual(new_turn.choices[0].message.content, want2.choices[0].text)
        # streamed the same
        streamed = "".join(c.choices[0].delta.content or "" for c in
                           self.chat(msgs, stream=True, **kw) if c.choices)
        self.assertEqual(streamed, got.choices[0].message.content)
        for body in ({"continue_final_message": True, "messages": msgs[:1]},
                     {"continue_final_message": True, "add_generation_prompt": True}):
            with self.subTest(body=body), self.assertRaises(openai.BadRequestError) as cm:
                self.chat(body.pop("messages", msgs), extra_body=body, **kw)
            self.assertEqual(cm.exception.body["param"], "continue_final_message")

    def test_completion_prompt_arrays_and_echo(self):
        """A prompt array is one prompt each (strings or id arrays), n
        choices per prompt, indexed prompt-major; usage counts each prompt
        once. echo puts the prompt before the completion, streaming too."""
        kw = dict(model="m", max_tokens=6, temperature=0)
        alone = [self.client.completions.create(prompt=p, **kw).choices[0].text
                 for p in ("Once upon a time", "The little dog")]
        ids = self.client.post(self.server.http_url + "/tokenize",
                               body={"content": "The little dog"}, cast_to=object)
        r = self.client.completions.create(prompt=["Once upon a time", "The little dog"], n=2,
                                           **kw)
        self.assertEqual([c.index for c in r.choices], [0, 1, 2, 3])
        self.assertEqual([c.text for c in r.choices], [alone[0]] * 2 + [alone[1]] * 2)
        one = self.client.completions.create(prompt="Once upon a time", **kw)
        self.assertEqual(r.usage.prompt_tokens, one.usage.prompt_tokens + ids["count"])
        self.assertEqual(r.usage.completion_tokens, 4 * 6)
        # arrays of ids, one prompt each
        r2 = self.client.completions.create(prompt=[ids["tokens"], ids["tokens"]], **kw)
        self.assertEqual([c.text for c in r2.choices], [alone[1]] * 2)
        # echo
        e = self.client.completions.create(prompt="Once upon a time", echo=True, **kw)
        self.assertEqual(e.choices[0].text, "Once upon a time" + alone[0])
        streamed = "".join(c.choices[0].text for c in self.client.completions.create(
            prompt="Once upon a time", echo=True, stream=True, **kw) if c.choices)
        self.assertEqual(streamed, "Once upon a time" + alone[0])
        e2 = self.client.completions.create(prompt=[ids["tokens"]], echo=True, **kw)
        self.assertTrue(e2.choices[0].text.endswith("The little dog" + alone[1]),
                        e2.choices[0].text)
        for bad, param in ((dict(prompt=["a"] * 33, n=2), "prompt"),
                           (dict(prompt="a", echo=True, logprobs=1), "echo"),
                           (dict(prompt="a", suffix="b"), "suffix"),  # no FIM tokens here
                           (dict(prompt=[]), "prompt")):
            with self.subTest(bad=bad), self.assertRaises(openai.BadRequestError) as cm:
                self.client.completions.create(model="m", max_tokens=2, **bad)
            self.assertEqual(cm.exception.body["param"], param)
        # the empty suffix clients send for "none" is no suffix
        self.assertEqual(self.client.completions.create(prompt="Once upon a time", suffix="",
                                                        **kw).choices[0].text, alone[0])

    def test_tokenize_detokenize_and_usage_tiers(self):
        """POST /tokenize and /detokenize in llama-server's and vLLM's
        shapes, and usage.prompt_tokens_details.cached_tokens_by_tier."""
        def post(path, body):  # at the root, as llama-server and vLLM serve them
            return self.client.post(self.server.http_url + path, body=body, cast_to=object)
        a = post("/tokenize", {"content": "Once upon a time"})
        b = post("/tokenize", {"prompt": "Once upon a time", "add_special_tokens": True})
        self.assertEqual(a["tokens"], b["tokens"])
        self.assertEqual(a["count"], len(a["tokens"]))
        self.assertGreater(a["max_model_len"], 0)
        no_bos = post("/tokenize", {"content": "Once upon a time", "add_special": False})
        self.assertEqual(no_bos["tokens"], a["tokens"][1:])
        chat = post("/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
        r = self.chat([{"role": "user", "content": "hi"}], max_tokens=1)
        self.assertEqual(chat["count"], r.usage.prompt_tokens)
        d = post("/detokenize", {"tokens": no_bos["tokens"]})
        self.assertEqual(d["content"].strip(), "Once upon a time")
        self.assertEqual(d["prompt"], d["content"])
        for path, body, param in (("/tokenize", {}, "content"),
                                  ("/detokenize", {"tokens": [10 ** 6]}, "tokens")):
            with self.subTest(path=path), self.assertRaises(openai.BadRequestError) as cm:
                post(path, body)
            self.assertEqual(cm.exception.body["param"], param)
        details = r.usage.prompt_tokens_details.model_dump()
        tiers = details["cached_tokens_by_tier"]
        self.assertEqual(sorted(tiers), ["device", "disk", "host", "shared"])
        self.assertEqual(sum(tiers.values()), details["cached_tokens"])

    def test_seed_range(self):
        """seed takes [0, 2^64) over JSON as well (jansson stops at 2^63-1):
        the largest repeats, one past it is a 400 naming seed, not "invalid
        JSON"; other integer fields name themselves when given one that
        large."""
        kw = dict(model="m", prompt="Once upon a time", max_tokens=8, temperature=1)
        a = self.client.completions.create(seed=2 ** 64 - 1, **kw).choices[0].text
        b = self.client.completions.create(seed=2 ** 64 - 1, **kw).choices[0].text
        self.assertEqual(a, b)
        for seed in (2 ** 64, 10 ** 30, -(10 ** 30)):
            with self.subTest(seed=seed), self.assertRaises(openai.BadRequestError) as cm:
                self.client.completions.create(seed=seed, **kw)
            self.assertEqual(cm.exception.body["param"], "seed")
        with self.assertRaises(openai.BadRequestError) as cm:
            self.client.completions.create(model="m", prompt="x", max_tokens=10 ** 30)
        self.assertEqual(cm.exception.body["param"], "max_tokens")

    def test_invalid_requests(self):
        cases = [
            dict(n=0),
            dict(n=65),
            dict(n=2, extra_body={"session_id": "s"}),
            dict(top_logprobs=2),
            dict(logprobs=True, top_logprobs=21),
            dict(temperature=5),
            dict(top_p=0),
            dict(max_tokens=-1),
            dict(max_tokens=10 ** 7),
            dict(stop=["a"] * 9),
            dict(messages=[]),
            dict(messages=[{"role": "wizard", "content": "x"}]),
            dict(messages=[{"role": "user", "content": [{"type": "image_url",
                                                         "image_url": {"url": "x"}}]}]),
            dict(messages=[{"role": "user"}]),
        ]
        for case in cases:
            with self.subTest(case=case):
                kw = {"messages": [{"role": "user", "content": "x"}], "model": "m"}
                kw.update(case)
                with self.assertRaises(openai.BadRequestError) as cm:
                    self.client.chat.completions.create(**kw)
                self.assertEqual(cm.exception.body["type"], "invalid_request_error")
                self.assertIn("message", cm.exception.body)
        with self.assertRaises(openai.BadRequestError) as cm:
            self.chat([{"role": "user", "content": "word " * 5000}], max_tokens=5)
        self.assertEqual(cm.exception.body["code"], "context_length_exceeded")


if __name__ == "__main__":
    harness.main()
