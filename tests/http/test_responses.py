#!/usr/bin/env python3
"""OpenAI's Responses API (POST /v1/responses, GET/DELETE /v1/responses/{id};
docs/openai.md, "Responses") driven by the official `openai` package
against the real `cairn serve` on the bundled model.

usage: test_responses.py CAIRN_BIN MODEL [unittest args...]

Covers: responses.create (output items, usage with cached tokens, status
incomplete at max_output_tokens, the request fields echoed), retrieve and
delete, store false, structured output through text.format, streaming with
responses.stream and stream=True (the spec's event names, sequence numbers,
deltas assembling to the final object), a chain of three turns with
previous_response_id served from the stored conversation, the chain
continued after a SIGKILL and restart over the same --cache-dir (and lost
without one), a function-call round trip (forced call, its output sent back,
streamed arguments; stateless with the items resent), and the 400/404s.
"""
import json
import os
import sys
import unittest
import urllib.error
import urllib.request

import jsonschema
import openai

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import SHORT_HANG_GUARD_S, Scratch, Server  # noqa: E402

CAIRN, MODEL = harness.take_argv("CAIRN_BIN", "MODEL", usage=__doc__)

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "strict": True,
           "parameters": {"type": "object",
                          "properties": {"city": {"type": "string", "maxLength": 24},
                                         "unit": {"enum": ["celsius", "fahrenheit"]}},
                          "required": ["city", "unit"], "additionalProperties": False}}
MOOD = {"type": "object", "properties": {"mood": {"enum": ["happy", "sad", "sleepy"]},
                                         "age": {"type": "integer"}},
        "required": ["mood", "age"], "additionalProperties": False}
MOOD_FORMAT = {"format": {"type": "json_schema", "name": "mood", "schema": MOOD, "strict": True}}


def client_of(server):
    return openai.OpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0,
                         timeout=SHORT_HANG_GUARD_S)


def message_text(r):
    return "".join(p.text for item in r.output if item.type == "message"
                   for p in item.content if p.type == "output_text")


class Responses(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.scratch = Scratch("cairn-responses-")
        cls.addClassCleanup(cls.scratch.close)
        cls.server = cls.scratch.start(CAIRN, ["-m", MODEL, "--cache-dir", cls.scratch.path("kv")],
                                       http=True, start_timeout=SHORT_HANG_GUARD_S)
        cls.client = client_of(cls.server)
        cls.addClassCleanup(lambda: cls.client.close())

    def create(self, **kw):
        kw.setdefault("model", "stories260K")
        return self.client.responses.create(**kw)

    def test_create_retrieve_delete(self):
        r = self.create(input="Tell me about a dog named Max.", max_output_tokens=20,
                        temperature=0, instructions="Dogs! You tell stories.",
                        metadata={"run": "one"})
        self.assertEqual(r.object, "response")
        self.assertRegex(r.id, r"^resp_[0-9a-f]{32}$")
        self.assertEqual(r.status, "incomplete")
        self.assertEqual(r.incomplete_details.reason, "max_output_tokens")
        self.assertEqual([i.type for i in r.output], ["message"])
        self.assertEqual(r.output[0].role, "assistant")
        self.assertTrue(r.output_text)
        self.assertEqual(r.output_text, message_text(r))
        self.assertEqual(r.usage.output_tokens, 20)
        self.assertEqual(r.usage.total_tokens, r.usage.input_tokens + 20)
        self.assertIsNotNone(r.usage.input_tokens_details.cached_tokens)
        self.assertEqual((r.instructions, r.metadata, r.store), ("Dogs! You tell stories.",
                                                                {"run": "one"}, True))
        self.assertEqual((r.temperature, r.max_output_tokens, r.previous_response_id),
                         (0, 20, None))
        got = self.client.responses.retrieve(r.id)
        self.assertEqual(got.model_dump(), r.model_dump())
        self.client.responses.delete(r.id)
        with self.assertRaises(openai.NotFoundError):
            self.client.responses.retrieve(r.id)
        with self.assertRaises(openai.NotFoundError):
            self.client.responses.delete(r.id)
        with self.assertRaises(openai.NotFoundError):
            self.create(input="x", previous_response_id=r.id, max_output_tokens=2)

    def test_store_false(self):
        r = self.create(input="A story.", max_output_tokens=5, temperature=0, store=False)
        self.assertFalse(r.store)
        self.assertRegex(r.id, r"^resp_[0-9a-f]{32}$")
        with self.assertRaises(openai.NotFoundError):
            self.client.responses.retrieve(r.id)
        stored = self.create(input="A story.", max_output_tokens=5, temperature=0)
        self.assertEqual(r.output_text, stored.output_text)
        # continuing without storing: the stored one stays as it was
        more = self.create(input="More.", max_output_tokens=5, temperature=0, store=False,
                           previous_response_id=stored.id)
        with self.assertRaises(openai.NotFoundError):
            self.client.responses.retrieve(more.id)
        self.assertEqual(self.client.responses.retrieve(stored.id).output_text,
                         stored.output_text)

    def test_structured_output(self):
        for seed in range(3):
            with self.subTest(seed=seed):
                r = self.create(input="Describe the girl as JSON.", text=MOOD_FORMAT,
                                max_output_tokens=200, temperature=1.0, extra_body={"seed": seed})
                self.assertEqual(r.status, "completed")
                jsonschema.validate(json.loads(r.output_text), MOOD)
                self.assertEqual(r.text.format.type, "json_schema")

    def test_stream(self):
        kw = dict(model="m", input="Describe the boy as JSON.", text=MOOD_FORMAT,
                  max_output_tokens=200, temperature=0)
        whole = self.client.responses.create(**kw)
        self.assertEqual(whole.status, "completed")
        with self.client.responses.stream(**kw) as s:
            deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
            final = s.get_final_response()
        self.assertEqual("".join(deltas), whole.output_text)
        self.assertEqual(final.output_text, whole.output_text)
        self.assertEqual(final.usage.output_tokens, whole.usage.output_tokens)
        self.assertEqual(self.client.responses.retrieve(final.id).output_text, whole.output_text)
        events = list(self.client.responses.create(stream=True, **kw))
        self.assertEqual([e.sequence_number for e in events], list(range(len(events))))
        kinds = [e.type for e in events]
        self.assertEqual(kinds[:4], ["response.created", "response.in_progress",
                                     "response.output_item.added", "response.content_part.added"])
        self.assertEqual(kinds[-4:], ["response.output_text.done", "response.content_part.done",
                                      "response.output_item.done", "response.completed"])
        self.assertTrue(all(k == "response.output_text.delta" for k in kinds[4:-4]))
        self.assertEqual(events[0].response.id, events[-1].response.id)
        self.assertEqual(events[0].response.status, "in_progress")
        self.assertEqual(events[-4].text, whole.output_text)
        self.assertEqual(events[-1].response.output_text, whole.output_text)
        # cut by max_output_tokens: response.incomplete ends the stream
        cut = list(self.client.responses.create(model="m", input="A story.", stream=True,
                                                max_output_tokens=3, temperature=0))
        self.assertEqual(cut[-1].type, "response.incomplete")
        self.assertEqual(cut[-1].response.usage.output_tokens, 3)

    def chain(self, client, first, turns):
        """Responses each continuing the one before with previous_response_id."""
        out, prev = [], first
        for text in turns:
            r = client.responses.create(model="m", input=text, max_output_tokens=12,
                                        temperature=0, previous_response_id=prev.id)
            self.assertEqual(r.previous_response_id, prev.id)
            # the whole conversation so far is the prompt, and all of it
            # (but the previous reply's last token, sampled and never fed
            # back) comes from the stored session's cache
            history = prev.usage.input_tokens + prev.usage.output_tokens
            self.assertGreater(r.usage.input_tokens, history)
            self.assertGreaterEqual(r.usage.input_tokens_details.cached_tokens, history - 1)
            out.append(r)
            prev = r
        return out

    def test_chain_of_three(self):
        one = self.create(input="Tell me about a fox.", max_output_tokens=12, temperature=0,
                          instructions="Foxes! You tell stories.")
        two, three = self.chain(self.client, one, ["And then?", "How did it end?"])
        # the same conversation resent as items (the reply as output_text)
        # is accepted; its prompt is the retokenized reply, not the stored
        # tokens, so only the chain is served from the session
        items = [{"role": "system", "content": "Foxes! You tell stories."},
                 {"role": "user", "content": "Tell me about a fox."},
                 {"type": "message", "role": "assistant",
                  "content": [{"type": "output_text", "text": one.output_text}]},
                 {"role": "user", "content": "And then?"}]
        again = self.create(input=items, max_output_tokens=12, temperature=0, store=False)
        self.assertGreater(again.usage.input_tokens, one.usage.input_tokens + 2)
        # forking: a second continuation of `one` leaves `two` as it was
        branch = self.create(input="Something else.", max_output_tokens=12, temperature=0,
                             previous_response_id=one.id)
        self.assertNotEqual(branch.id, two.id)
        self.assertEqual(self.client.responses.retrieve(two.id).output_text, two.output_text)
        self.assertEqual(self.client.responses.retrieve(three.id).previous_response_id, two.id)

    def test_function_call_round_trip(self):
        ask = "What is the weather in Paris?"
        forced = dict(tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"},
                      max_output_tokens=200, temperature=0)
        r = self.create(input=ask, **forced)
        calls = [i for i in r.output if i.type == "function_call"]
        self.assertEqual(len(calls), 1, r.output)
        call = calls[0]
        self.assertEqual(call.name, "get_weather")
        self.assertTrue(call.call_id.startswith("call_"))
        jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
        self.assertEqual(r.status, "completed")
        self.assertEqual(r.tools[0].name, "get_weather")
        # its output back, continuing the stored conversation
        out = [{"type": "function_call_output", "call_id": call.call_id,
                "output": "sunny, 18 C"}]
        two = self.create(input=out, tools=[WEATHER], previous_response_id=r.id,
                          max_output_tokens=12, temperature=0)
        self.assertIn(two.status, ("completed", "incomplete"))
        self.assertGreater(two.usage.input_tokens, r.usage.input_tokens + r.usage.output_tokens)
        # stateless: the call and its output resent as items
        items = [{"role": "user", "content": ask},
                 {"type": "function_call", "call_id": call.call_id, "name": call.name,
                  "arguments": call.arguments}] + out
        three = self.create(input=items, tools=[WEATHER], max_output_tokens=12, temperature=0)
        self.assertIn(three.status, ("completed", "incomplete"))
        # streamed: the same call, its arguments in the delta and done events
        with self.client.responses.stream(model="m", input=ask, **forced) as s:
            events = list(s)
            final = s.get_final_response()
        args = "".join(e.delta for e in events
                       if e.type == "response.function_call_arguments.delta")
        self.assertEqual(args, call.arguments)
        done = [e for e in events if e.type == "response.function_call_arguments.done"]
        self.assertEqual([d.arguments for d in done], [call.arguments])
        self.assertEqual([(i.name, i.arguments) for i in final.output if i.type == "function_call"],
                         [(call.name, call.arguments)])

    def test_errors(self):
        url = self.server.http_url + "/v1/responses"

        def post(body):
            req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
            try:
                with urllib.request.urlopen(req, timeout=SHORT_HANG_GUARD_S) as r:
                    return r.status, json.loads(r.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())

        bad = [({}, "input"), ({"input": []}, "input"), ({"input": 5}, "input"),
               ({"input": [{"type": "input_image", "image_url": "x"}]}, "input"),
               ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input"),
               ({"input": "x", "max_output_tokens": -1}, "max_output_tokens"),
               ({"input": "x", "temperature": 9}, "temperature"),
               ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
               ({"input": "x", "tool_choice": {"type": "function"}}, "tool_choice"),
               ({"input": "x", "text": {"format": {"type": "json_schema", "name": "x",
                                                   "schema": {"type": "string",
                                                              "pattern": "^(?=a)a$"}}}}, "text"),
               ({"input": "x", "previous_response_id": "resp_nope"}, "previous_response_id"),
               ({"input": "x", "metadata": {"k": 5}}, "metadata"),
               ({"input": "x", "background": True}, "background"),
               ({"input": "x", "store": "yes"}, "store")]
        for body, param in bad:
            with self.subTest(body=body):
                status, out = post(body)
                self.assertEqual(status, 400, out)
                self.assertEqual(out["error"]["param"], param, out)
        status, out = post({"input": "x", "previous_response_id": "resp_" + "0" * 32})
        self.assertEqual((status, out["error"]["param"]), (404, "previous_response_id"))
        for path in ("/v1/responses/nope", "/v1/responses/resp_" + "1" * 32):
            with self.subTest(path=path):
                with self.assertRaises(urllib.error.HTTPError) as cm:
                    urllib.request.urlopen(self.server.http_url + path,
                                           timeout=SHORT_HANG_GUARD_S)
                self.assertEqual(cm.exception.code, 404)
        req = urllib.request.Request(self.server.http_url + "/v1/responses/x", method="PUT")
        with self.assertRaises(urllib.error.HTTPError) as cm:
            urllib.request.urlopen(req, timeout=SHORT_HANG_GUARD_S)
        self.assertEqual(cm.exception.code, 405)
        self.assertEqual(post({"input": "x", "max_output_tokens": 1})[0], 200)


class Restart(unittest.TestCase):
    def test_chain_survives_sigkill(self):
        with Scratch("cairn-responses-restart-") as scratch:
            args = ["-m", MODEL, "--cache-dir", scratch.path("kv")]
            srv = scratch.start(CAIRN, args, http=True, start_timeout=SHORT_HANG_GUARD_S)
            with client_of(srv) as c:
                one = c.responses.create(model="m", input="Tell me about an owl.",
                                         max_output_tokens=12, temperature=0)
                two = c.responses.create(model="m", input="And then?", max_output_tokens=12,
                                         temperature=0, previous_response_id=one.id)
            # a crash: nothing is written back at stop, so what survives was
            # durable before each answer
            srv = scratch.track(srv.restart(kill=True))
            with client_of(srv) as c:
                self.assertEqual(c.responses.retrieve(two.id).model_dump(), two.model_dump())
                three = self.chain_turn(c, two)
                self.assertEqual(c.responses.retrieve(three.id).previous_response_id, two.id)
            srv = scratch.track(srv.restart(kill=True))
            with client_of(srv) as c:
                self.assertEqual(c.responses.retrieve(three.id).output_text, three.output_text)
                self.chain_turn(c, three)

    def chain_turn(self, c, prev):
        r = c.responses.create(model="m", input="What next?", max_output_tokens=12,
                               temperature=0, previous_response_id=prev.id)
        self.assertGreater(r.usage.input_tokens, prev.usage.input_tokens + prev.usage.output_tokens)
        return r

    def test_in_memory_without_cache_dir(self):
        with Scratch("cairn-responses-mem-") as scratch:
            srv = scratch.start(CAIRN, ["-m", MODEL], http=True, start_timeout=SHORT_HANG_GUARD_S)
            with client_of(srv) as c:
                one = c.responses.create(model="m", input="A story.", max_output_tokens=4)
                self.assertEqual(c.responses.retrieve(one.id).id, one.id)
            srv = scratch.track(srv.restart(kill=True))
            with client_of(srv) as c:
                with self.assertRaises(openai.NotFoundError):
                    c.responses.retrieve(one.id)


if __name__ == "__main__":
    harness.main()
