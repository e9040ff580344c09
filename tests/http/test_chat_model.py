#!/usr/bin/env python3
"""A tool-call round trip through the OpenAI facade on the real instruct model
(CAIRN_CHAT_MODEL: Qwen2.5-Coder-0.5B-Instruct), with the `openai` package:
the model is offered a tool, answers with a call (parsed into
message.tool_calls, finish_reason "tool_calls"), the same call arrives as
streamed tool_calls deltas, and the conversation continues with the tool's
result, served mostly from the prefix cache; tool_choice "required" turns
a reply that would be text into a call; a call written as a fenced ```json
block (what this model often writes) is read as one, and a fenced block
that calls no tool stays content, streamed as it comes. Skips (exit 77) when the model
file is absent.

usage: test_chat_model.py CAIRN_BIN [unittest args...]
"""
import json
import os
import sys
import unittest

import openai

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import HANG_GUARD_S, SHORT_HANG_GUARD_S, Server  # noqa: E402

[CAIRN] = harness.take_argv("CAIRN_BIN", usage=__doc__)
CHAT_MODEL = os.environ.get("CAIRN_CHAT_MODEL", "")
if not os.path.exists(CHAT_MODEL):
    print(f"skipped: CAIRN_CHAT_MODEL ({CHAT_MODEL or 'unset'}) is absent; "
          "scripts/get-model fetches it")
    sys.exit(77)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}
QUESTION = [{"role": "user", "content": "What is the weather like in Paris right now?"}]


class ToolCallRoundTrip(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server(CAIRN, ["-m", CHAT_MODEL, "--kv-mem", "128M", "--model-name", "qwen"],
                            http=True, start_timeout=SHORT_HANG_GUARD_S)
        cls.client = openai.OpenAI(base_url=cls.server.http_url + "/v1", api_key="unused",
                                   max_retries=0, timeout=HANG_GUARD_S)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop()

    def test_round_trip(self):
        self.assertEqual(self.client.models.list().data[0].id, "qwen")
        r = self.client.chat.completions.create(model="qwen", messages=QUESTION,
                                                tools=[WEATHER_TOOL], max_tokens=64,
                                                temperature=0)
        choice = r.choices[0]
        self.assertEqual(choice.finish_reason, "tool_calls", choice.message)
        calls = choice.message.tool_calls
        self.assertEqual(len(calls), 1)
        self.assertEqual(calls[0].type, "function")
        self.assertEqual(calls[0].function.name, "get_weather")
        args = json.loads(calls[0].function.arguments)
        self.assertIn("paris", json.dumps(args).lower())
        self.assertTrue(calls[0].id)

        # streamed: the same call, as tool_calls deltas, no content leaked
        chunks = list(self.client.chat.completions.create(
            model="qwen", messages=QUESTION, tools=[WEATHER_TOOL], max_tokens=64,
            temperature=0, stream=True))
        name, arguments, content = "", "", ""
        for c in chunks:
            if not c.choices:
                continue
            d = c.choices[0].delta
            content += d.content or ""
            for tc in d.tool_calls or []:
                self.assertEqual(tc.index, 0)
                name += tc.function.name or ""
                arguments += tc.function.arguments or ""
        self.assertEqual(chunks[-1].choices[0].finish_reason, "tool_calls")
        self.assertEqual(name, "get_weather")
        self.assertEqual(json.loads(arguments), args)
        self.assertEqual(content.strip(), (choice.message.content or "").strip())

        # the tool's answer goes back; the history is served from the cache
        follow = QUESTION + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": calls[0].id, "type": "function",
                 "function": {"name": "get_weather", "arguments": calls[0].function.arguments}}]},
            {"role": "tool", "tool_call_id": calls[0].id,
             "content": json.dumps({"temperature_c": 18, "sky": "sunny"})}]
        r2 = self.client.chat.completions.create(model="qwen", messages=follow,
                                                 tools=[WEATHER_TOOL], max_tokens=40,
                                                 temperature=0)
        self.assertIn(r2.choices[0].finish_reason, ("stop", "length", "tool_calls"))
        self.assertGreater(r2.usage.prompt_tokens, r.usage.prompt_tokens)
        self.assertGreaterEqual(r2.usage.prompt_tokens_details.cached_tokens,
                                r.usage.prompt_tokens // 16 * 16 - 16)

    def test_fill_in_the_middle(self):
        """suffix on a code model: the prompt is Qwen2.5-Coder's FIM form
        (<|fim_prefix|> prompt <|fim_suffix|> suffix <|fim_middle|>) and the
        reply is the middle."""
        prefix, suffix = "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"
        r = self.client.completions.create(model="qwen", prompt=prefix, suffix=suffix,
                                           max_tokens=8, temperature=0)
        base = "http://%s:%d" % self.server.http_address
        n = lambda text: self.client.post(base + "/tokenize", body={"content": text},  # noqa: E731
                                          cast_to=object)["count"]
        self.assertEqual(r.usage.prompt_tokens, n(prefix) + n(suffix) + 3)  # + the 3 markers
        self.assertIn("return a + b", r.choices[0].text)
        self.assertNotIn("<|fim", r.choices[0].text)

    def test_assistant_prefill_continues(self):
        """A trailing assistant message is continued: the reply follows its
        text (Qwen's turn is left open), it does not start a new answer."""
        msgs = [{"role": "user", "content": "Reply with the JSON {\"ok\": true} and nothing else."},
                {"role": "assistant", "content": "{\"ok\":"}]
        r = self.client.chat.completions.create(model="qwen", messages=msgs, max_tokens=6,
                                                temperature=0)
        self.assertTrue(r.choices[0].message.content.lstrip().startswith("true"),
                        r.choices[0].message.content)

    def test_required_forces_a_call(self):
        # a greeting would be answered in text; "required" makes it a call
        greet = [{"role": "user", "content": "Say hello to me."}]
        free = self.client.chat.completions.create(model="qwen", messages=greet,
                                                   tools=[WEATHER_TOOL], max_tokens=32,
                                                   temperature=0)
        self.assertIsNone(free.choices[0].message.tool_calls, free.choices[0].message)
        r = self.client.chat.completions.create(model="qwen", messages=greet,
                                                tools=[WEATHER_TOOL], tool_choice="required",
                                                max_tokens=64, temperature=0)
        self.assertEqual(r.choices[0].finish_reason, "tool_calls", r.choices[0].message)
        calls = r.choices[0].message.tool_calls
        self.assertEqual([c.function.name for c in calls], ["get_weather"] * len(calls))
        for c in calls:
            self.assertIsInstance(json.loads(c.function.arguments)["city"], str)

    def stream(self, messages, **kw):
        """(content, name, arguments, finish_reason, number of chunks carrying
        content) of a streamed answer."""
        content, name, arguments, finish, n_content = "", "", "", None, 0
        for c in self.client.chat.completions.create(model="qwen", messages=messages,
                                                     stream=True, **kw):
            if not c.choices:
                continue
            d = c.choices[0].delta
            if d.content:
                content += d.content
                n_content += 1
            for tc in d.tool_calls or []:
                name += tc.function.name or ""
                arguments += tc.function.arguments or ""
            finish = c.choices[0].finish_reason or finish
        return content, name, arguments, finish, n_content

    def test_fenced_call_with_tool_choice_auto(self):
        # Qwen2.5-Coder often writes its call as a ```json block (these two
        # prompts do at temperature 0): read as a call, streamed or not
        for city in ("Tokyo", "London"):
            prompt = (f"Use the get_weather tool to find the weather in {city}." if city == "Tokyo"
                      else "Can you check the weather in London for me?")
            msgs = [{"role": "user", "content": prompt}]
            with self.subTest(city=city):
                r = self.client.chat.completions.create(model="qwen", messages=msgs,
                                                        tools=[WEATHER_TOOL], tool_choice="auto",
                                                        max_tokens=80, temperature=0)
                choice = r.choices[0]
                self.assertEqual(choice.finish_reason, "tool_calls", choice.message)
                self.assertEqual([c.function.name for c in choice.message.tool_calls],
                                 ["get_weather"])
                args = json.loads(choice.message.tool_calls[0].function.arguments)
                self.assertEqual(args, {"city": city})
                self.assertIsNone(choice.message.content)
                content, name, arguments, finish, _ = self.stream(
                    msgs, tools=[WEATHER_TOOL], tool_choice="auto", max_tokens=80, temperature=0)
                self.assertEqual((content, name, finish), ("", "get_weather", "tool_calls"))
                self.assertEqual(json.loads(arguments), args)

    def test_fenced_json_of_no_tool_is_content(self):
        # asked for code, the model answers with a ```json call of a tool it
        # made up: that is content, and a stream sends it as it comes (in
        # several chunks, not held back to the end)
        msgs = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
        r = self.client.chat.completions.create(model="qwen", messages=msgs, tools=[WEATHER_TOOL],
                                                max_tokens=80, temperature=0)
        choice = r.choices[0]
        self.assertIsNone(choice.message.tool_calls, choice.message)
        self.assertIn("```", choice.message.content)
        content, name, _, finish, n_content = self.stream(msgs, tools=[WEATHER_TOOL],
                                                          max_tokens=80, temperature=0)
        self.assertEqual((content, name, finish), (choice.message.content, "", choice.finish_reason))
        self.assertGreater(n_content, 3)

    def test_tool_choice_none_answers_in_text(self):
        r = self.client.chat.completions.create(model="qwen", messages=QUESTION,
                                                tools=[WEATHER_TOOL], tool_choice="none",
                                                max_tokens=16, temperature=0)
        self.assertIn(r.choices[0].finish_reason, ("stop", "length"))
        self.assertIsNone(r.choices[0].message.tool_calls)


if __name__ == "__main__":
    harness.main()
