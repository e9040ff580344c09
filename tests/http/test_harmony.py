#!/usr/bin/env python3
"""Replies in channels (gpt-oss's harmony) through POST /v1/chat/completions:
the analysis channel comes back as `reasoning_content`, the final channel as
`content`, a commentary message to functions.NAME as a tool call, streamed
and not, and no channel marker ever reaches a client. The same through the
Responses API (a reasoning item) and Anthropic's Messages API (a thinking
block), each read back by the official client when it is installed, and
reasoning sent back by those clients taken into the prompt.

usage: test_harmony.py CAIRN_BIN MODEL [unittest args...]

No small model writes harmony, so the bundled model is given gpt-oss's chat
template (tests/chat/templates/real/openai-gpt-oss-120b.jinja) and its reply
is forced to a harmony text by a json_schema `const`: the reply is that text
as a JSON string, quotes included ('"<|channel|>analysis<|message|>...'),
which the server reads as harmony. Needs the `gguf` Python package.
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
TEMPLATE = os.path.join(HERE, "..", "chat", "templates", "real", "openai-gpt-oss-120b.jinja")

REASONED = ("<|channel|>analysis<|message|>Think it over.<|end|><|start|>assistant"
            "<|channel|>final<|message|>Answer.")
CALL = ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{}<|call|>")
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


class Harmony(TemplateServerCase):
    binary, model, template = CAIRN, MODEL, TEMPLATE

    def answer(self, body):
        status, text = post(self.server.http_url, body)
        self.assertEqual(status, 200, text)
        choice = json.loads(text)["choices"][0]
        return choice["message"], choice["finish_reason"]

    def stream(self, body):
        """The deltas of a streamed answer, and the last finish_reason."""
        status, text = post(self.server.http_url, dict(body, stream=True))
        self.assertEqual(status, 200, text)
        deltas, finish = [], None
        for line in text.splitlines():
            if not line.startswith("data: {"):
                continue
            for ch in json.loads(line[6:]).get("choices", []):
                deltas.append(ch["delta"])
                finish = ch["finish_reason"] or finish
        return deltas, finish

    def joined(self, deltas, key):
        return "".join(d.get(key) or "" for d in deltas)

    def test_reasoning_and_content(self):
        msg, finish = self.answer(forced(REASONED))
        self.assertEqual(finish, "stop")
        self.assertEqual(msg["reasoning_content"], "Think it over.")
        # the reply is the JSON string: its quotes are text around the channels
        self.assertEqual(msg["content"].strip(), '"Answer."')
        self.assertNotIn("tool_calls", msg)
        deltas, finish = self.stream(forced(REASONED))
        self.assertEqual(finish, "stop")
        self.assertEqual(self.joined(deltas, "reasoning_content"), msg["reasoning_content"])
        self.assertEqual(self.joined(deltas, "content"), msg["content"])
        for d in deltas:
            self.assertNotIn("<|", json.dumps(d))

    def test_tool_call(self):
        msg, finish = self.answer(forced(CALL, tools=TOOLS))
        self.assertEqual(finish, "tool_calls")
        self.assertEqual(msg["reasoning_content"], "Need the weather.")
        [call] = msg["tool_calls"]
        self.assertEqual(call["function"], {"name": "get_weather", "arguments": "{}"})
        self.assertNotIn("<|", msg["content"] or "")
        deltas, finish = self.stream(forced(CALL, tools=TOOLS))
        self.assertEqual(finish, "tool_calls")
        self.assertEqual(self.joined(deltas, "reasoning_content"), "Need the weather.")
        calls = [c for d in deltas for c in d.get("tool_calls") or []]
        self.assertEqual(calls[0]["function"]["name"], "get_weather")
        self.assertEqual("".join(c["function"].get("arguments", "") for c in calls), "{}")
        for d in deltas:
            self.assertNotIn("<|", json.dumps(d))

    def test_reasoning_sent_back(self):
        # an earlier turn's reasoning (reasoning_content, or Hugging Face's
        # `thinking`) is taken on assistant messages and refused elsewhere
        history = [{"role": "user", "content": "Weather?"},
                   {"role": "assistant", "content": "", "reasoning_content": "Need it.",
                    "tool_calls": [{"id": "c0", "type": "function",
                                    "function": {"name": "get_weather", "arguments": "{}"}}]},
                   {"role": "tool", "tool_call_id": "c0", "content": "sunny"}]
        status, text = post(self.server.http_url,
                            {"messages": history, "tools": TOOLS, "max_tokens": 2})
        self.assertEqual(status, 200, text)
        status, text = post(self.server.http_url,
                            {"messages": [{"role": "user", "content": "x", "thinking": "y"}],
                             "max_tokens": 2})
        self.assertEqual(status, 400, text)
        self.assertIn("reasoning_content", json.loads(text)["error"]["message"])

    def test_responses_reasoning_item(self):
        status, text = post(self.server.http_url, forced_response(REASONED), "/v1/responses")
        self.assertEqual(status, 200, text)
        obj = json.loads(text)
        self.assertNotIn("<|", json.dumps(obj["output"]))  # (the echoed schema has them)
        thought, message = obj["output"]
        self.assertEqual(thought["type"], "reasoning")
        self.assertTrue(thought["id"].startswith("rs_"))
        self.assertEqual(thought["content"], [{"type": "reasoning_text",
                                               "text": "Think it over."}])
        self.assertEqual(message["type"], "message")
        self.assertEqual(message["content"][0]["text"].strip(), '"Answer."')
        # streamed: one reasoning item and one message, and the completed
        # object the same as the one answered whole. (The forced reply is a
        # JSON string: its opening quote is content written before the
        # analysis, so the stream opens the message first here; a model's
        # own reply starts with its analysis.)
        status, text = post(self.server.http_url, forced_response(REASONED, stream=True),
                            "/v1/responses")
        self.assertEqual(status, 200, text)
        events = sse(text)
        for e in events:
            if e["type"] != "response.created" and e["type"] != "response.in_progress":
                self.assertNotIn("<|", json.dumps(e.get("item") or e.get("delta") or ""))
        deltas = [e for e in events if e["type"] == "response.reasoning_text.delta"]
        self.assertEqual("".join(e["delta"] for e in deltas), "Think it over.")
        self.assertEqual(len({e["output_index"] for e in deltas}), 1)
        self.assertEqual(len({e["output_index"] for e in events
                              if e["type"] == "response.output_text.delta"}), 1)
        [done] = [e for e in events if e["type"] == "response.reasoning_text.done"]
        self.assertEqual(done["text"], "Think it over.")
        items = [e["item"] for e in events if e["type"] == "response.output_item.done"]
        self.assertEqual(sorted(i["type"] for i in items), ["message", "reasoning"])
        final = events[-1]["response"]
        self.assertEqual(events[-1]["type"], "response.completed")
        self.assertEqual(final["output"], items)
        strip = lambda out: sorted(({k: v for k, v in i.items() if k != "id"} for i in out),
                                   key=lambda i: i["type"])
        self.assertEqual(strip(final["output"]), strip(obj["output"]))
        self.assertEqual([e["sequence_number"] for e in events], list(range(len(events))))
        # the effort asked for is echoed
        status, text = post(self.server.http_url,
                            forced_response(REASONED, reasoning={"effort": "high"}),
                            "/v1/responses")
        self.assertEqual(json.loads(text)["reasoning"]["effort"], "high")
        openai = official("openai")
        if openai is None:
            return
        client = openai.OpenAI(base_url=self.server.http_url + "/v1", api_key="unused")
        body = forced_response(REASONED)
        r = client.responses.create(**body)
        [thought] = [i for i in r.output if i.type == "reasoning"]
        self.assertEqual(thought.content[0].text, "Think it over.")
        self.assertEqual(r.output_text.strip(), '"Answer."')
        with client.responses.stream(**body) as stream:
            kinds = [e.type for e in stream]
            r = stream.get_final_response()
        self.assertIn("response.reasoning_text.delta", kinds)
        [thought] = [i for i in r.output if i.type == "reasoning"]
        self.assertEqual(thought.content[0].text, "Think it over.")
        self.assertEqual(r.output_text.strip(), '"Answer."')

    def test_responses_reasoning_sent_back(self):
        call = [{"type": "function_call", "call_id": "c0", "name": "get_weather",
                 "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c0", "output": "sunny"}]
        thought = {"type": "reasoning", "id": "rs_0", "summary": [],
                   "content": [{"type": "reasoning_text", "text": "Need the weather now."}]}
        flat = [{"type": "function", "name": "get_weather", "parameters": TOOLS[0]["function"]
                 ["parameters"]}]

        def input_tokens(items):
            status, text = post(self.server.http_url,
                                {"model": "m", "max_output_tokens": 1, "store": False,
                                 "tools": flat, "input": items}, "/v1/responses")
            self.assertEqual(status, 200, text)
            return json.loads(text)["usage"]["input_tokens"]

        user = [{"role": "user", "content": "Weather?"}]
        # kept before the call (the template renders it there), so it is read
        self.assertGreater(input_tokens(user + [thought] + call), input_tokens(user + call))
        # one with nothing to read (another server's encrypted_content) adds nothing
        sealed = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "x"}
        self.assertEqual(input_tokens(user + [sealed] + call), input_tokens(user + call))
        status, text = post(self.server.http_url,
                            {"model": "m", "input": user + [dict(thought, content="x")]},
                            "/v1/responses")
        self.assertEqual(status, 400, text)
        self.assertEqual(json.loads(text)["error"]["param"], "input")

    def test_anthropic_thinking_block(self):
        status, text = post(self.server.http_url, forced_message(REASONED), "/v1/messages")
        self.assertEqual(status, 200, text)
        content = json.loads(text)["content"]
        self.assertNotIn("<|", json.dumps(content))  # (usage's cache_miss excerpt may)
        thinking, answer = content
        self.assertEqual(thinking, {"type": "thinking", "thinking": "Think it over.",
                                    "signature": ""})
        self.assertEqual(answer["type"], "text")
        self.assertEqual(answer["text"].strip(), '"Answer."')
        status, text = post(self.server.http_url, forced_message(REASONED, stream=True),
                            "/v1/messages")
        self.assertEqual(status, 200, text)
        events = sse(text)
        for e in events:
            self.assertNotIn("<|", json.dumps(e.get("delta") or e.get("content_block") or ""))
        # blocks one at a time, in the order the reply wrote them: the forced
        # JSON string's opening quote, the thinking, the rest of the text
        starts = [e for e in events if e["type"] == "content_block_start"]
        self.assertEqual([(e["index"], e["content_block"]["type"]) for e in starts],
                         [(0, "text"), (1, "thinking"), (2, "text")])
        deltas = [e for e in events if e["type"] == "content_block_delta"]
        self.assertEqual("".join(e["delta"].get("thinking", "") for e in deltas
                                 if e["index"] == 1), "Think it over.")
        self.assertEqual([e["delta"]["type"] for e in deltas if e["index"] == 1][-1],
                         "signature_delta")
        self.assertEqual("".join(e["delta"].get("text", "") for e in deltas
                                 if e["index"] != 1), answer["text"])
        self.assertEqual([e["index"] for e in events if e["type"] == "content_block_stop"],
                         [0, 1, 2])
        status, text = post(self.server.http_url,
                            forced_message(REASONED, output_format={"type": "json"}),
                            "/v1/messages")
        self.assertEqual(status, 400, text)
        self.assertIn("output_format", text)
        anthropic = official("anthropic")
        if anthropic is None:
            return
        client = anthropic.Anthropic(base_url=self.server.http_url, api_key="unused")
        body = forced_message(REASONED)
        extra = {k: body.pop(k) for k in ("output_format", "temperature")}
        m = client.messages.create(**body, extra_body=extra)
        self.assertEqual([b.type for b in m.content], ["thinking", "text"])
        self.assertEqual(m.content[0].thinking, "Think it over.")
        with client.messages.stream(**body, extra_body=extra) as stream:
            m = stream.get_final_message()
        [thought] = [b for b in m.content if b.type == "thinking"]
        self.assertEqual(thought.thinking, "Think it over.")
        self.assertEqual("".join(b.text for b in m.content if b.type == "text"),
                         answer["text"])

    def test_anthropic_thinking_sent_back(self):
        tools = [{"name": "get_weather", "description": "Weather in a city",
                  "input_schema": TOOLS[0]["function"]["parameters"]}]

        def input_tokens(assistant):
            status, text = post(self.server.http_url, {
                "model": "m", "max_tokens": 1, "tools": tools,
                "messages": [{"role": "user", "content": "Weather?"},
                             {"role": "assistant", "content": assistant},
                             {"role": "user", "content": [{"type": "tool_result",
                                                           "tool_use_id": "t0",
                                                           "content": "sunny"}]}]},
                "/v1/messages")
            self.assertEqual(status, 200, text)
            usage = json.loads(text)["usage"]  # Anthropic's three parts of the prompt
            return (usage["input_tokens"] + usage["cache_read_input_tokens"] +
                    usage["cache_creation_input_tokens"])

        use = {"type": "tool_use", "id": "t0", "name": "get_weather", "input": {}}
        thought = {"type": "thinking", "thinking": "Need the weather now.", "signature": "s"}
        self.assertGreater(input_tokens([thought, use]), input_tokens([use]))
        self.assertEqual(input_tokens([{"type": "redacted_thinking", "data": "x"}, use]),
                         input_tokens([use]))

    def test_protocol_reads_channels(self):
        # the msgpack protocol's generate over messages: `text` stays the whole
        # reply, `content` and `reasoning` are its parts, calls as tool_calls
        fmt = lambda text: {"type": "json_schema",  # noqa: E731
                            "json_schema": {"name": "reply", "schema": {"const": text}}}
        msgs = [{"role": "user", "content": "Hi"}]
        with self.server.client() as c:
            r = c.generate(messages=msgs, max_tokens=300, temperature=0,
                           response_format=fmt(REASONED))
            self.assertIn("<|channel|>analysis", r.text)
            self.assertEqual(r.reasoning, "Think it over.")
            self.assertEqual(r.content.strip(), '"Answer."')
            self.assertEqual(r.finish_reason, "stop")
            r = c.generate(messages=msgs, tools=TOOLS, max_tokens=300, temperature=0,
                           response_format=fmt(CALL))
            self.assertEqual(r.finish_reason, "tool_calls")
            self.assertEqual(r.reasoning, "Need the weather.")
            self.assertEqual(r.tool_calls[0]["function"]["name"], "get_weather")
            # a raw prompt is not a chat reply: left as it is
            r = c.generate("Hi", max_tokens=2)
            self.assertIsNone(r.content)
            self.assertIsNone(r.reasoning)

    def test_reasoning_effort(self):
        # OpenAI's field, and vLLM's chat_template_kwargs (the system message's
        # "Reasoning: " line; the rendering itself is checked in tests/chat)
        for extra in ({"reasoning_effort": "high"}, {"reasoning_effort": "medium"},
                      {"chat_template_kwargs": {"reasoning_effort": "low"}}):
            status, text = post(self.server.http_url,
                                dict({"messages": [{"role": "user", "content": "x"}],
                                      "max_tokens": 1}, **extra))
            self.assertEqual(status, 200, text)
        for extra, param in (({"reasoning_effort": "extreme"}, "reasoning_effort"),
                             ({"chat_template_kwargs": {"reasoning_effort": 3}},
                              "chat_template_kwargs.reasoning_effort")):
            status, text = post(self.server.http_url,
                                dict({"messages": [{"role": "user", "content": "x"}]}, **extra))
            self.assertEqual(status, 400, text)
            self.assertEqual(json.loads(text)["error"]["param"], param)


if __name__ == "__main__":
    harness.main()
