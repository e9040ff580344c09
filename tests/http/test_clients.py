#!/usr/bin/env python3
"""The client libraries agent frameworks are built on, unchanged, against
`cairn serve --http-port` on the bundled model: LangChain's ChatOpenAI
(invoke, stream, with_structured_output with a pydantic model using
ge/le bounds, bind_tools) and instructor. A library that is not installed
skips its class with a message (scripts/setup.sh --test installs them).

usage: test_clients.py CAIRN_BIN MODEL [unittest args...]

The bundled model writes stories, not answers: what is checked is that
each library gets what it expects from the protocol (types, validation,
tool calls parsed back), with greedy decoding where text is compared.
"""
import importlib.util
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import SHORT_HANG_GUARD_S, Server  # noqa: E402

CAIRN, MODEL = harness.take_argv("CAIRN_BIN", "MODEL", usage=__doc__)


def have(*modules):
    return all(importlib.util.find_spec(m) is not None for m in modules)


SERVER = None


def setUpModule():
    global SERVER
    SERVER = Server(CAIRN, ["-m", MODEL], http=True, start_timeout=SHORT_HANG_GUARD_S)


def tearDownModule():
    SERVER.stop()


def story_model():
    """A pydantic model with the bounds pydantic users write (ge/le, gt,
    max_length): JSON Schema minimum/maximum/exclusiveMinimum/maxLength."""
    from pydantic import BaseModel, Field

    class Story(BaseModel):
        title: str = Field(max_length=40)
        chapters: int = Field(ge=1, le=12)
        rating: float = Field(gt=0, le=5)

    return Story


@unittest.skipUnless(have("langchain_openai"), "langchain-openai is not installed "
                     "(scripts/setup.sh --test installs it)")
class LangChain(unittest.TestCase):
    def llm(self, **kw):
        from langchain_openai import ChatOpenAI
        return ChatOpenAI(base_url=SERVER.http_url + "/v1", api_key="unused", model="stories",
                          max_retries=0, timeout=SHORT_HANG_GUARD_S, **kw)

    def test_invoke_and_stream(self):
        llm = self.llm(temperature=0, max_tokens=16)
        whole = llm.invoke("Tell me a story.").content
        self.assertTrue(whole)
        streamed = "".join(chunk.content for chunk in llm.stream("Tell me a story."))
        self.assertEqual(streamed, whole)

    def test_structured_output_with_bounds(self):
        Story = story_model()
        for method in ("json_schema", "function_calling"):
            with self.subTest(method=method):
                llm = self.llm(temperature=1, max_tokens=200, seed=7)
                out = llm.with_structured_output(Story, method=method).invoke("A story, please.")
                self.assertIsInstance(out, Story)  # pydantic validated the bounds
                self.assertTrue(1 <= out.chapters <= 12 and 0 < out.rating <= 5)

    def test_bind_tools(self):
        from langchain_core.tools import tool

        @tool
        def get_forecast(days: int, metric: bool) -> str:
            """The weather for the next days."""
            return "sunny"

        llm = self.llm(temperature=0, max_tokens=80).bind_tools([get_forecast],
                                                                 tool_choice="get_forecast")
        msg = llm.invoke("What is the weather in Paris?")
        self.assertEqual(len(msg.tool_calls), 1, msg)
        call = msg.tool_calls[0]
        self.assertEqual(call["name"], "get_forecast")
        self.assertIsInstance(call["args"]["days"], int)
        self.assertIsInstance(call["args"]["metric"], bool)
        self.assertTrue(call["id"])


@unittest.skipUnless(have("instructor", "openai"), "instructor is not installed "
                     "(scripts/setup.sh --test installs it)")
class Instructor(unittest.TestCase):
    def test_response_model(self):
        import instructor
        import openai
        Story = story_model()
        raw = openai.OpenAI(base_url=SERVER.http_url + "/v1", api_key="unused", max_retries=0,
                            timeout=SHORT_HANG_GUARD_S)
        for mode in (instructor.Mode.JSON_SCHEMA, instructor.Mode.TOOLS):
            with self.subTest(mode=mode):
                client = instructor.from_openai(raw, mode=mode)
                out = client.chat.completions.create(
                    model="stories", response_model=Story, max_retries=0, max_tokens=200,
                    temperature=1, seed=11,
                    messages=[{"role": "user", "content": "A story, please."}])
                self.assertIsInstance(out, Story)
        raw.close()


if __name__ == "__main__":
    harness.main()
