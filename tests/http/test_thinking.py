#!/usr/bin/env python3
"""Replies that think first (Qwen3's <think>...</think>) through every front:
the reasoning comes back as `reasoning_content` (chat), a reasoning item
(Responses) and a thinking block (Anthropic), streamed and not, with its
token count in usage; no <think> marker reaches a client;
`chat_template_kwargs.enable_thinking: false` (and Anthropic's
`thinking: {type: "disabled"}`, OpenAI's `reasoning_effort: "none"`) opens
the reply with an empty reasoning, as Qwen3's template does; reasoning sent
back is rendered where the template keeps it.

usage: test_thinking.py CAIRN_BIN MODEL [unittest args...]

No small model here thinks, so the bundled model is given Qwen3's chat
template (tests/chat/templates/real/Qwen-Qwen3-0.6B.jinja) and its reply is
forced by a json_schema `const`: the reply is that text as a JSON string,
quotes included ('"<think>...'), which the server reads as a thinking
reply. Needs the `gguf` Python package.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
import harness  # noqa: E402
from forced_reply import (TemplateServerCase, forced, forced_message, forced_response,  # noqa: E402
                          official, post, sse)

CAIRN, MODEL = harness.take_argv("CAIRN_BIN", "MODEL", usage=__doc__)
TEMPLATE = os.path.join(HERE, "..", "chat", "templates", "real", "Qwen-Qwen3-0.6B.jinja")

REASONED = "<think>Think it over.</think>Answer."
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


class Thinking(TemplateServerCase):
    binary, model, template = CAIRN, MODEL, TEMPLATE

    def chat(self, body):
        status, text = post(self.server.http_url, body)
        self.assertEqual(status, 200, text)
        return json.loads(text)

    def prompt_tokens(self, **extra):
        body = dict({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}, **extra)
        return self.chat(body)["usage"]["prompt_tokens"]

    def test_reasoning_and_content(self):
        obj = self.chat(forced(REASONED))
        msg = obj["choices"][0]["message"]
        self.assertEqual(msg["reasoning_content"], "Think it over.")
        # the reply is the JSON string: its quotes are content around the reasoning
        self.assertEqual(msg["content"], '"Answer."')
        details = obj["usage"]["completion_tokens_details"]
        self.assertGreater(details["reasoning_tokens"], 0)
        self.assertLess(details["reasoning_tokens"], obj["usage"]["completion_tokens"])
        status, text = post(self.server.http_url, forced(REASONED, stream=True,
                                                         stream_options={"include_usage": True}))
        self.assertEqual(status, 200, text)
        events = sse(text)
        deltas = [ch["delta"] for e in events for ch in e.get("choices", [])]
        self.assertEqual("".join(d.get("reasoning_content") or "" for d in deltas),
                         "Think it over.")
        self.assertEqual("".join(d.get("content") or "" for d in deltas), '"Answer."')
        for d in deltas:
            self.assertNotIn("think>", json.dumps(d))
        self.assertEqual(events[-1]["usage"]["completion_tokens_details"], details)

    def test_second_think_is_content(self):
        # a <think> after the answer is text, with tools as without (the
        # content is read for calls as it is, not split a second time)
        reply = "<think>r</think>x <think>y</think> z"
        for tools in (None, TOOLS):
            body = forced(reply)
            if tools:
                body["tools"] = tools
            msg = self.chat(body)["choices"][0]["message"]
            self.assertEqual(msg["reasoning_content"], "r", tools)
            self.assertEqual(msg["content"], '"x <think>y</think> z"', tools)
            self.assertFalse(msg.get("tool_calls"), tools)

    def test_forced_call_is_not_reasoning(self):
        # tool_choice required: the reply is the call's JSON, held and read whole
        clock = [{"type": "function", "function": {
            "name": "get_time", "parameters": {"type": "object", "properties": {},
                                               "additionalProperties": False}}}]
        body = {"messages": [{"role": "user", "content": "Time?"}], "tools": clock,
                "tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 300,
                "temperature": 0}
        msg = self.chat(body)["choices"][0]["message"]
        [call] = msg["tool_calls"]
        self.assertEqual(call["function"], {"name": "get_time", "arguments": "{}"})
        self.assertIsNone(msg.get("reasoning_content"))
        status, text = post(self.server.http_url, dict(body, stream=True))
        deltas = [ch["delta"] for e in sse(text) for ch in e.get("choices", [])]
        self.assertEqual("".join(d.get("content") or "" for d in deltas), "")
        calls = [c for d in deltas for c in d.get("tool_calls") or []]
        self.assertEqual(calls[0]["function"]["name"], "get_time")

    def test_enable_thinking(self):
        # false: the prompt ends with an empty <think></think> block (more tokens)
        base = self.prompt_tokens()
        off = self.prompt_tokens(chat_template_kwargs={"enable_thinking": False})
        self.assertGreater(off, base)
        self.assertEqual(self.prompt_tokens(chat_template_kwargs={"enable_thinking": True}), base)
        self.assertEqual(self.prompt_tokens(reasoning_effort="none"), off)
        status, text = post(self.server.http_url,
                            {"messages": [{"role": "user", "content": "Hi"}],
                             "chat_template_kwargs": {"enable_thinking": "no"}})
        self.assertEqual(status, 400, text)
        self.assertEqual(json.loads(text)["error"]["param"],
                         "chat_template_kwargs.enable_thinking")

    def test_server_default_kwargs(self):
        # serve --default-chat-template-kwargs: what a request leaves out
        base = self.prompt_tokens()
        off = self.prompt_tokens(chat_template_kwargs={"enable_thinking": False})
        srv = harness.Server(CAIRN, ["-m", self.templated, "--default-chat-template-kwargs",
                                     '{"enable_thinking": false, "other": [1]}'],
                             http=True, start_timeout=harness.SHORT_HANG_GUARD_S)
        try:
            def tokens(**extra):
                body = dict({"messages": [{"role": "user", "content": "Hi"}],
                             "max_tokens": 1}, **extra)
                status, text = post(srv.http_url, body)
                self.assertEqual(status, 200, text)
                return json.loads(text)["usage"]["prompt_tokens"]
            self.assertEqual(tokens(), off)
            self.assertEqual(tokens(chat_template_kwargs={"enable_thinking": True}), base)
            self.assertEqual(tokens(reasoning_effort="high"), base)  # an effort asks to reason
            with srv.client() as c:  # the msgpack protocol too
                r = c.generate(messages=[{"role": "user", "content": "Hi"}], max_tokens=1)
                self.assertEqual(r.usage.prompt_tokens, off)
        finally:
            srv.stop()

    def test_reasoning_sent_back(self):
        # kept on the replies after the last question (a multi-step answer),
        # dropped on earlier ones, as Qwen3's template renders them
        call = [{"id": "c0", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{}"}}]

        def tokens(reasoning, later_question):
            msgs = [{"role": "user", "content": "Weather?"},
                    {"role": "assistant", "content": "", "tool_calls": call,
                     "reasoning_content": reasoning},
                    {"role": "tool", "tool_call_id": "c0", "content": "sunny"}]
            if later_question:
                msgs += [{"role": "assistant", "content": "Sunny."},
                         {"role": "user", "content": "Thanks"}]
            return self.chat({"messages": msgs, "tools": TOOLS,
                              "max_tokens": 1})["usage"]["prompt_tokens"]

        self.assertGreater(tokens("Need the weather.", False), tokens("", False))
        self.assertEqual(tokens("Need the weather.", True), tokens("", True))

    def test_responses_reasoning_item(self):
        status, text = post(self.server.http_url, forced_response(REASONED), "/v1/responses")
        self.assertEqual(status, 200, text)
        obj = json.loads(text)
        kinds = {i["type"]: i for i in obj["output"]}
        self.assertEqual(kinds["reasoning"]["content"],
                         [{"type": "reasoning_text", "text": "Think it over."}])
        self.assertEqual(kinds["message"]["content"][0]["text"], '"Answer."')
        self.assertGreater(obj["usage"]["output_tokens_details"]["reasoning_tokens"], 0)
        status, text = post(self.server.http_url, forced_response(REASONED, stream=True),
                            "/v1/responses")
        events = sse(text)
        self.assertEqual("".join(e["delta"] for e in events
                                 if e["type"] == "response.reasoning_text.delta"),
                         "Think it over.")
        self.assertEqual("".join(e["delta"] for e in events
                                 if e["type"] == "response.output_text.delta"), '"Answer."')
        openai = official("openai")
        if openai is not None:
            client = openai.OpenAI(base_url=self.server.http_url + "/v1", api_key="unused")
            r = client.responses.create(**forced_response(REASONED))
            [thought] = [i for i in r.output if i.type == "reasoning"]
            self.assertEqual(thought.content[0].text, "Think it over.")
            self.assertGreater(r.usage.output_tokens_details.reasoning_tokens, 0)

    def test_anthropic_thinking(self):
        status, text = post(self.server.http_url, forced_message(REASONED), "/v1/messages")
        self.assertEqual(status, 200, text)
        thinking, answer = json.loads(text)["content"]
        self.assertEqual(thinking["thinking"], "Think it over.")
        self.assertEqual(answer["text"], '"Answer."')

        def input_tokens(**extra):
            body = dict({"model": "m", "max_tokens": 1,
                         "messages": [{"role": "user", "content": "Hi"}]}, **extra)
            status, text = post(self.server.http_url, body, "/v1/messages")
            self.assertEqual(status, 200, text)
            usage = json.loads(text)["usage"]
            return (usage["input_tokens"] + usage["cache_read_input_tokens"] +
                    usage["cache_creation_input_tokens"])

        base = input_tokens()
        self.assertEqual(input_tokens(thinking={"type": "enabled", "budget_tokens": 1024}), base)
        self.assertGreater(input_tokens(thinking={"type": "disabled"}), base)
        status, text = post(self.server.http_url,
                            {"model": "m", "max_tokens": 1, "thinking": {"type": "maybe"},
                             "messages": [{"role": "user", "content": "Hi"}]}, "/v1/messages")
        self.assertEqual(status, 400, text)
        self.assertIn("thinking.type", text)
        anthropic = official("anthropic")
        if anthropic is not None:
            client = anthropic.Anthropic(base_url=self.server.http_url, api_key="unused")
            m = client.messages.create(model="m", max_tokens=1,
                                       thinking={"type": "disabled"},
                                       messages=[{"role": "user", "content": "Hi"}])
            self.assertEqual(m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) +
                             (m.usage.cache_creation_input_tokens or 0),
                             input_tokens(thinking={"type": "disabled"}))

    def test_protocol_reads_reasoning(self):
        fmt = {"type": "json_schema", "json_schema": {"name": "r", "schema": {"const": REASONED}}}
        with self.server.client() as c:
            r = c.generate(messages=[{"role": "user", "content": "Hi"}], max_tokens=300,
                           temperature=0, response_format=fmt)
            self.assertIn("<think>", r.text)
            self.assertEqual(r.reasoning, "Think it over.")
            self.assertEqual(r.content, '"Answer."')


if __name__ == "__main__":
    harness.main()
