#!/usr/bin/env python3
"""`cairn chat-format` against the Hugging Face rendering of chat templates.

usage: test_chat_templates.py CAIRN_BIN [unittest args...]

For the real instruct model (CAIRN_CHAT_MODEL; skipped with a message when the
file is absent) the template is the GGUF's own tokenizer.chat_template. For the
other families, vocab-only GGUFs are written here whose template is one of
tests/chat/templates/real/*.jinja (verbatim templates as the models ship them: Qwen2.5,
Qwen3, Phi-3.5, Mistral Nemo, gpt-oss; see PROVENANCE.md there) or, for families whose published
template could not be vendored, tests/chat/templates/*.jinja (restatements written for
these tests). Each
conversation is rendered with jinja2 exactly as transformers does
(ImmutableSandboxedEnvironment(trim_blocks, lstrip_blocks), tojson =
json.dumps(ensure_ascii=False), strftime_now the local time as transformers defines it),
and cairn's output must be byte-identical — after removing a leading BOS, which cairn
leaves to tokenization.
"""
import datetime
import json
import os
import subprocess
import sys
import tempfile
import unittest

import gguf
import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
import harness  # noqa: E402

[CAIRN] = harness.take_argv("CAIRN_BIN", usage=__doc__)
CHAT_MODEL = os.environ.get("CAIRN_CHAT_MODEL", "")


def hf_render(source, messages, tools, add_generation_prompt, bos, eos, **kwargs):
    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    # transformers' own: the local date and time at rendering (gpt-oss's system message)
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    text = env.from_string(source).render(messages=messages, tools=tools,
                                          add_generation_prompt=add_generation_prompt,
                                          bos_token=bos, eos_token=eos, **kwargs)
    if bos and text.startswith(bos):
        text = text[len(bos):]
    return text


def hf_messages(messages):
    """OpenAI messages as transformers expects them: tool-call arguments as
    objects (cairn is given the OpenAI JSON strings and must parse them)."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                c = json.loads(json.dumps(c))
                args = c["function"]["arguments"]
                if isinstance(args, str):
                    c["function"]["arguments"] = json.loads(args)
                calls.append(c)
            m["tool_calls"] = calls
        out.append(m)
    return out


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city — «quoted» \"text\" and a tab\there",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 16},
                "threshold": {"type": "number", "default": 0.1},
            },
            "required": ["city"],
        },
    },
}
TIME_TOOL = {"type": "function",
             "function": {"name": "get_time", "description": "", "parameters": {}}}

SYSTEM_USER = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Write hello world in C."},
]
MULTI_TURN = [
    {"role": "system", "content": "  Be kind.\n"},
    {"role": "user", "content": "Hi there! 日本語もOK?"},
    {"role": "assistant", "content": "Hello! はい。 "},
    {"role": "user", "content": "Say \"bye\"\twith a tab\nand a newline."},
]
NO_SYSTEM = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3+3?"},
]
USER_ONLY = [{"role": "user", "content": "Hello"}]
ARGS = '{"city": "Zürich", "days": 3, "ratio": 0.1, "tiny": 1e-7, "big": 1e16, ' \
       '"whole": 3.0, "neg": -2.5, "list": [1, 2.5, "x", null, true, {}], "nested": {"a": []}, ' \
       '"f": [1e15, 123456789.125, 0.0001, 1.5e-5, -0.0, 1e22, 5e-324, 1.7976931348623157e308, ' \
       '12345678901234567, -7, 0.30000000000000004, 2.5e-10]}'
TOOL_CONVERSATION = [
    {"role": "system", "content": "You can call tools."},
    {"role": "user", "content": "Weather in Zürich and the time?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0", "type": "function",
         "function": {"name": "get_weather", "arguments": ARGS}},
        {"id": "call_1", "type": "function",
         "function": {"name": "get_time", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_0", "content": "{\"temp\": 21}"},
    {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
    {"role": "assistant", "content": "It is 21 °C and noon."},
    {"role": "user", "content": "Thanks"},
    {"role": "assistant", "content": "Let me check again.", "tool_calls": [
        {"id": "call_2", "type": "function",
         "function": {"name": "get_time", "arguments": {"tz": "UTC"}}}]},
    {"role": "tool", "tool_call_id": "call_2", "content": "12:01"},
]
# Llama 3.1 takes one call per assistant turn and tools only with a user turn.
LLAMA_TOOL_CONVERSATION = [
    {"role": "system", "content": "You can call tools."},
    {"role": "user", "content": "Weather in Zürich?"},
    {"role": "assistant", "tool_calls": [
        {"id": "call_0", "type": "function",
         "function": {"name": "get_weather", "arguments": ARGS}}]},
    {"role": "tool", "tool_call_id": "call_0", "content": "{\"temp\": 21}"},
    {"role": "assistant", "content": "21 °C."},
    {"role": "user", "content": "Thanks"},
]

BASIC_CASES = [
    ("system_user", SYSTEM_USER, None),
    ("multi_turn", MULTI_TURN, None),
    ("no_system", NO_SYSTEM, None),
    ("user_only", USER_ONLY, None),
]


class ChatFormat:
    """Mixin: compare cairn with jinja2 for one GGUF."""
    model = None
    source = None
    bos = ""
    eos = ""
    family = None

    def cairn_format(self, messages, tools, gen_prompt, extra_args=()):
        with tempfile.TemporaryDirectory() as d:
            mpath = os.path.join(d, "messages.json")
            with open(mpath, "w", encoding="utf-8") as f:
                json.dump(messages, f, ensure_ascii=False)
            args = [CAIRN, "chat-format", "-m", self.model, "--messages", mpath, "--family"]
            if tools is not None:
                tpath = os.path.join(d, "tools.json")
                with open(tpath, "w", encoding="utf-8") as f:
                    json.dump(tools, f, ensure_ascii=False)
                args += ["--tools", tpath]
            if not gen_prompt:
                args.append("--no-generation-prompt")
            args += list(extra_args)
            r = subprocess.run(args, capture_output=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        self.assertEqual(r.stderr.decode().splitlines()[0], self.family)
        return r.stdout.decode("utf-8")

    def check(self, messages, tools=None, gen_prompt=True):
        expected = hf_render(self.source, hf_messages(messages), tools, gen_prompt, self.bos,
                             self.eos)
        got = self.cairn_format(messages, tools, gen_prompt)
        self.assertEqual(got, expected)

    def test_basic_conversations(self):
        for name, messages, tools in BASIC_CASES:
            for gen in (True, False):
                with self.subTest(conversation=name, generation_prompt=gen):
                    self.check(messages, tools, gen)


def write_vocab_gguf(path, template, specials, bos, eos, add_bos):
    """A vocab-only SentencePiece GGUF holding the family's special tokens."""
    w = gguf.GGUFWriter(path, "llama")
    tokens = ["<unk>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN] + [gguf.TokenType.BYTE] * 256
    for s in specials:
        if s not in tokens:
            tokens.append(s)
            types.append(gguf.TokenType.CONTROL)
    for word in ["▁", "▁Hello", "▁the", "e", "t", "a"]:
        tokens.append(word)
        types.append(gguf.TokenType.NORMAL)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types(types)
    w.add_bos_token_id(tokens.index(bos))
    w.add_eos_token_id(tokens.index(eos))
    w.add_add_bos_token(add_bos)
    w.add_chat_template(template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


SYNTHETIC = {
    # name: (template file, family, specials, bos, eos)
    "chatml": ("chatml.jinja", "chatml", ["<s>", "</s>", "<|im_start|>", "<|im_end|>"],
               "<s>", "<|im_end|>"),
    # Qwen's tool format without Qwen2.5's default system prompt (Qwen3-like)
    "chatml_tools": ("chatml_tools.jinja", "qwen2",
                     ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                     "<|endoftext|>", "<|im_end|>"),
    "llama3": ("llama3.jinja", "llama3",
               ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                "<|end_header_id|>", "<|eot_id|>"], "<|begin_of_text|>", "<|eot_id|>"),
    "llama31": ("llama31.jinja", "llama3",
                ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                 "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"],
                "<|begin_of_text|>", "<|eot_id|>"),
    "llama2": ("llama2.jinja", "llama2", ["<s>", "</s>"], "<s>", "</s>"),
    "mistral": ("mistral.jinja", "llama2", ["<s>", "</s>", "[INST]", "[/INST]"], "<s>", "</s>"),
    "mistral_tekken": ("mistral_tekken.jinja", "llama2", ["<s>", "</s>", "[INST]", "[/INST]"],
                       "<s>", "</s>"),
    "gemma": ("gemma.jinja", "gemma", ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"],
              "<bos>", "<eos>"),
    "phi3": ("phi3.jinja", "phi3",
             ["<s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
             "<s>", "<|endoftext|>"),
}

_tmpdir = tempfile.TemporaryDirectory()


def synthetic_case(key):
    fname, family, specials, bos, eos = SYNTHETIC[key]
    with open(os.path.join(HERE, "templates", fname), encoding="utf-8") as f:
        source = f.read()
    path = os.path.join(_tmpdir.name, key + ".gguf")
    write_vocab_gguf(path, source, specials, bos, eos, add_bos=bos != "<s>" or key != "chatml")
    attrs = {"model": path, "source": source, "bos": bos, "eos": eos, "family": family}
    return type(f"Synthetic_{key}", (ChatFormat, unittest.TestCase), attrs)


for _key in SYNTHETIC:
    globals()[f"Synthetic_{_key}"] = synthetic_case(_key)


class ChatmlTools(synthetic_case("chatml_tools")):
    def test_tools(self):
        for gen in (True, False):
            with self.subTest(generation_prompt=gen):
                self.check(TOOL_CONVERSATION, [WEATHER_TOOL, TIME_TOOL], gen)
        self.check(TOOL_CONVERSATION[1:], [WEATHER_TOOL], True)  # no system message
        self.check(NO_SYSTEM, [], True)


class Llama31Tools(synthetic_case("llama31")):
    def test_tools(self):
        for gen in (True, False):
            with self.subTest(generation_prompt=gen):
                self.check(LLAMA_TOOL_CONVERSATION, [WEATHER_TOOL, TIME_TOOL], gen)
        self.check(LLAMA_TOOL_CONVERSATION[1:], [WEATHER_TOOL], True)


# Real templates as the models ship them (tests/chat/templates/real/, PROVENANCE.md there):
# name: (file, family, specials, bos, eos, add_bos, tool conversations)
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def no_none_content(messages):
    """Qwen3's template tests `'</think>' in content`, which fails on None (in transformers
    too): the same conversation with assistant tool-call turns' content as ""."""
    return [dict(m, content="") if m.get("content") is None else m for m in messages]


# Replies with reasoning, as clients send them back (reasoning_content, vLLM's
# and llama.cpp's field) or as the raw text with <think>...</think> in the content.
_WEATHER_CALL = [{"id": "call_0", "type": "function",
                  "function": {"name": "get_weather", "arguments": "{\"city\": \"Zürich\"}"}}]
THINKING_CONVERSATIONS = [
    [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "", "reasoning_content": "\nNeed the weather.\n\n",
         "tool_calls": _WEATHER_CALL},
        {"role": "tool", "tool_call_id": "call_0", "content": "{\"temp\": 21}"},
        {"role": "assistant", "content": "\n\nIt is 21 °C.", "reasoning_content": "Got it."},
        {"role": "user", "content": "Thanks"},
        {"role": "assistant", "content": "<think>\nNice user.\n</think>\n\nYou're welcome."},
    ],
    [   # the same, now answered: every reply is before the last question
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "<think>\n\nNeed it.\n</think>\n\n",
         "tool_calls": _WEATHER_CALL},
        {"role": "tool", "tool_call_id": "call_0", "content": "{\"temp\": 21}"},
        {"role": "assistant", "content": "<think>a</think>b<think>c</think>\n\nIt is 21 °C."},
        {"role": "user", "content": "Thanks"},
    ],
    [   # a multi-step answer in progress: the reasoning of each step is kept
        {"role": "user", "content": "Weather in Zürich, then Bern?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "First Zürich.",
         "tool_calls": _WEATHER_CALL},
        {"role": "tool", "tool_call_id": "call_0", "content": "21"},
        {"role": "assistant", "content": "", "reasoning_content": "",
         "tool_calls": _WEATHER_CALL},
        {"role": "tool", "tool_call_id": "call_0", "content": "19"},
        {"role": "assistant", "content": "Zürich 21, Bern 19.", "reasoning_content": None},
    ],
    [   # a question that is a tool's answer only does not count as one
        {"role": "user", "content": "Go."},
        {"role": "assistant", "content": "<think>plan</think>ok"},
        {"role": "user", "content": "<tool_response>\nx\n</tool_response>"},
        {"role": "assistant", "content": "done", "reasoning_content": "r"},
    ],
]

REAL = {
    "qwen25": ("Qwen-Qwen2.5-7B-Instruct.jinja", "qwen2", QWEN_SPECIALS, "<|endoftext|>",
               "<|im_end|>", False, [TOOL_CONVERSATION, TOOL_CONVERSATION[1:]]),
    "qwen3": ("Qwen-Qwen3-0.6B.jinja", "qwen2", QWEN_SPECIALS, "<|endoftext|>", "<|im_end|>",
              False, [no_none_content(TOOL_CONVERSATION), no_none_content(TOOL_CONVERSATION[1:])]),
    "phi35": ("microsoft-Phi-3.5-mini-instruct.jinja", "phi3",
              ["<s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
              "<s>", "<|endoftext|>", True, []),
    "mistral_nemo": ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "llama2",
                     ["<s>", "</s>", "[INST]", "[/INST]"], "<s>", "</s>", True, []),
}


def real_case(key):
    fname, family, specials, bos, eos, add_bos, tool_convs = REAL[key]
    with open(os.path.join(HERE, "templates", "real", fname), encoding="utf-8") as f:
        source = f.read()
    path = os.path.join(_tmpdir.name, "real_" + key + ".gguf")
    write_vocab_gguf(path, source, specials, bos, eos, add_bos=add_bos)

    def test_tools(self):
        for conv in tool_convs:
            for tools in ([WEATHER_TOOL, TIME_TOOL], [WEATHER_TOOL]):
                for gen in (True, False):
                    with self.subTest(n_messages=len(conv), n_tools=len(tools),
                                      generation_prompt=gen):
                        self.check(conv, tools, gen)
        if tool_convs:
            self.check(tool_convs[0], None, True)  # tool turns without a tools list
            self.check(SYSTEM_USER, [], True)      # an empty tools list is no tools
            self.check(NO_SYSTEM + [{"role": "system", "content": "Now be brief."},
                                    {"role": "user", "content": "ok"}], None, True)

    def test_thinking(self):
        # Qwen3: reasoning rendered back for the replies after the last question,
        # dropped before it, read from reasoning_content or from the content's
        # <think>...</think>; enable_thinking=false opens the reply with an empty one
        for conv in THINKING_CONVERSATIONS:
            for tools in (None, [WEATHER_TOOL]):
                for gen in (True, False):
                    with self.subTest(n_messages=len(conv), tools=bool(tools),
                                      generation_prompt=gen):
                        self.check(conv, tools, gen)
        for conv in (USER_ONLY, THINKING_CONVERSATIONS[0]):
            expected = hf_render(self.source, hf_messages(conv), None, True, self.bos, self.eos,
                                 enable_thinking=False)
            got = self.cairn_format(conv, None, True, ["--no-thinking"])
            self.assertEqual(got, expected)
            self.assertTrue(got.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"))

    attrs = {"model": path, "source": source, "bos": bos, "eos": eos, "family": family}
    if tool_convs:
        attrs["test_tools"] = test_tools
    if key == "qwen3":
        attrs["test_thinking"] = test_thinking
    return type(f"Real_{key}", (ChatFormat, unittest.TestCase), attrs)


for _key in REAL:
    globals()[f"Real_{_key}"] = real_case(_key)


# gpt-oss (harmony): OpenAI's template as the model ships it (PROVENANCE.md). Its
# TypeScript rendering of tool schemas has many branches, each exercised here.
HARMONY_SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>",
                    "<|channel|>", "<|start|>", "<|end|>", "<|message|>", "<|call|>"]
SCHEMA_TOOL = {
    "type": "function",
    "function": {
        "name": "search_catalogue",
        "description": "Search — «the» catalogue",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "Words to look for"},
                "kind": {"type": "string", "enum": ["book", "film", 3, True, None],
                         "default": "book"},
                "note": {"type": "string", "nullable": True, "default": "n/a"},
                "limit": {"type": "integer", "default": 10},
                "ratio": {"type": "number", "default": 0.25},
                "exact": {"type": "boolean", "default": False},
                "tags": {"type": "array", "items": {"type": "string"}},
                "scores": {"type": "array", "items": {"type": "number"}, "nullable": True},
                "counts": {"type": "array", "items": {"type": "integer"}},
                "flags": {"type": "array", "items": {"type": "boolean"}},
                "anything": {"type": "array"},
                "pairs": {"type": "array", "items": {"type": "array",
                                                     "items": {"type": "string"}}},
                "objects": {"type": "array", "items": {"type": ["object", "object"]}},
                "records": {"type": "array", "items": {
                    "type": "object",
                    "properties": {"id": {"type": "integer"}, "label": {"type": "string"},
                                   "extra": {"type": "object"}},
                    "required": ["id"]}},
                "small": {"type": "array", "items": {"type": "object",
                                                     "properties": {"a": {"type": "string"}}}},
                "either": {"type": ["string", "null"]},
                "single": {"type": ["integer"]},
                "choice": {"oneOf": [{"type": "string", "description": "a name",
                                      "default": "x"},
                                     {"type": "integer"},
                                     {"type": "object", "properties": {"k": {"type": "number"}}}],
                           "default": "x"},
                "filter": {"type": "object",
                           "properties": {"from": {"type": "string"},
                                          "to": {"type": "string", "enum": ["a", "b"]},
                                          "inner": {"type": "object",
                                                    "properties": {"z": {"type": "boolean"}},
                                                    "required": ["z"]}},
                           "required": ["from"]},
                "free": {"type": "object"},
                "untyped": {"description": "no type"},
                "literal": {"type": "null", "default": None},
            },
            "required": ["query", "filter"],
        },
    },
}
NO_PARAMS_TOOL = {"type": "function", "function": {"name": "ping", "description": "Ping."}}
HARMONY_TOOL_CONVERSATION = [
    {"role": "system", "content": "You can call tools."},
    {"role": "user", "content": "Weather in Zürich?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_0", "type": "function",
         "function": {"name": "get_weather", "arguments": ARGS}}]},
    {"role": "tool", "tool_call_id": "call_0", "content": "{\"temp\": 21, \"sky\": \"☀\"}"},
    {"role": "assistant", "content": "21 °C."},
    {"role": "user", "content": "And the time?"},
    # content beside a call is the call's analysis (kept: no reply follows)
    {"role": "assistant", "content": "Checking the clock.", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_time", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "12:00\n\"noon\""},
]


class Harmony(ChatFormat, unittest.TestCase):
    """gpt-oss's harmony format against its published template."""
    family = "harmony"
    bos, eos = "<|startoftext|>", "<|return|>"

    @classmethod
    def setUpClass(cls):
        with open(os.path.join(HERE, "templates", "real", "openai-gpt-oss-120b.jinja"),
                  encoding="utf-8") as f:
            cls.source = f.read()
        cls.model = os.path.join(_tmpdir.name, "gpt_oss.gguf")
        write_vocab_gguf(cls.model, cls.source, HARMONY_SPECIALS, cls.bos, cls.eos, add_bos=False)

    def check(self, messages, tools=None, gen_prompt=True, hf_extra=None):
        """hf_extra: fields only jinja2 is given (cairn chat-format reads no
        reasoning), where the template must drop them."""
        hf = hf_messages(messages)
        for i, extra in (hf_extra or {}).items():
            hf[i] = dict(hf[i], **extra)
        got = self.cairn_format(messages, tools, gen_prompt)
        expected = hf_render(self.source, hf, tools, gen_prompt, self.bos, self.eos)
        if got != expected:  # the date may have turned between the two
            got = self.cairn_format(messages, tools, gen_prompt)
        self.assertEqual(got, expected)

    def test_dated_system_message(self):
        got = self.cairn_format(USER_ONLY, None, True)
        today = datetime.datetime.now().strftime("%Y-%m-%d")
        self.assertIn("Current date: " + today + "\n\nReasoning: medium\n\n", got)
        self.assertTrue(got.endswith("<|start|>user<|message|>Hello<|end|><|start|>assistant"))

    def test_tools(self):
        for tools in ([WEATHER_TOOL, TIME_TOOL], [SCHEMA_TOOL, NO_PARAMS_TOOL, WEATHER_TOOL]):
            for gen in (True, False):
                with self.subTest(tools=[t["function"]["name"] for t in tools],
                                  generation_prompt=gen):
                    self.check(HARMONY_TOOL_CONVERSATION, tools, gen)
                    self.check(HARMONY_TOOL_CONVERSATION[1:], tools, gen)  # no instructions
                    self.check(HARMONY_TOOL_CONVERSATION[:-2], tools, gen)
        self.check(SYSTEM_USER, [SCHEMA_TOOL], True)
        self.check(HARMONY_TOOL_CONVERSATION, None, True)  # calls without a tools list
        self.check(SYSTEM_USER, [], True)                  # an empty tools list is no tools
        self.check(USER_ONLY, [NO_PARAMS_TOOL], True)

    def test_several_calls_render_the_first(self):
        # the template renders one call per message; results are the last call's
        # (and it cannot take a None content beside calls, as transformers neither)
        self.check(no_none_content(TOOL_CONVERSATION), [WEATHER_TOOL, TIME_TOOL], True)

    def test_later_system_and_developer_messages_dropped(self):
        self.check(NO_SYSTEM + [{"role": "system", "content": "Now be brief."},
                                {"role": "user", "content": "ok"}], None, True)
        self.check([{"role": "developer", "content": "Dev rules."}] + NO_SYSTEM, None, False)
        self.check([{"role": "system", "content": ""}] + NO_SYSTEM, None, True)

    def test_reasoning_dropped_where_the_template_drops_it(self):
        # earlier replies lose their reasoning; a call's reasoning goes once a reply follows
        self.check(NO_SYSTEM, None, True, hf_extra={1: {"thinking": "2+2 is 4."}})
        conv = HARMONY_TOOL_CONVERSATION[1:]
        for gen in (True, False):
            self.check(conv, [WEATHER_TOOL], gen, hf_extra={1: {"thinking": "Need weather."}})
        self.check(NO_SYSTEM[:2], None, True, hf_extra={1: {"thinking": "t"}})


class Generic(unittest.TestCase):
    def test_no_template_is_generic(self):
        path = os.path.join(_tmpdir.name, "none.gguf")
        w = gguf.GGUFWriter(path, "llama")
        w.add_tokenizer_model("llama")
        tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
        w.add_token_list(tokens)
        w.add_token_scores([0.0] * len(tokens))
        w.add_token_types([2, 3, 3] + [6] * 256)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(SYSTEM_USER, f)
        r = subprocess.run([CAIRN, "chat-format", "-m", path, "--messages", f.name],
                           capture_output=True, timeout=60)
        os.unlink(f.name)
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        self.assertEqual(r.stdout.decode(), "<|system|>\nYou are a terse assistant.\n"
                                            "<|user|>\nWrite hello world in C.\n<|assistant|>\n")
        self.assertIn("no tokenizer.chat_template", r.stderr.decode())

    def test_bad_messages_refused(self):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump([{"role": "wizard", "content": "x"}], f)
        model = os.path.join(_tmpdir.name, "phi3.gguf")
        r = subprocess.run([CAIRN, "chat-format", "-m", model, "--messages", f.name],
                           capture_output=True, timeout=60)
        os.unlink(f.name)
        self.assertNotEqual(r.returncode, 0)
        self.assertEqual(r.stdout, b"")


@unittest.skipUnless(os.path.exists(CHAT_MODEL),
                     f"real chat model absent ({CHAT_MODEL or 'CAIRN_CHAT_MODEL unset'}); "
                     "fetch it with scripts/get-model")
class RealQwen(ChatFormat, unittest.TestCase):
    family = "qwen2"

    @classmethod
    def setUpClass(cls):
        cls.model = CHAT_MODEL
        r = gguf.GGUFReader(CHAT_MODEL)
        f = r.fields["tokenizer.chat_template"]
        cls.source = bytes(f.parts[f.data[0]]).decode("utf-8")
        tokens = r.fields["tokenizer.ggml.tokens"]

        def token(key):
            fid = r.fields[key]
            i = int(fid.parts[fid.data[0]][0])
            return bytes(tokens.parts[tokens.data[i]]).decode("utf-8")
        cls.bos = token("tokenizer.ggml.bos_token_id")
        cls.eos = token("tokenizer.ggml.eos_token_id")

    def test_tools(self):
        for gen in (True, False):
            with self.subTest(generation_prompt=gen):
                self.check(TOOL_CONVERSATION, [WEATHER_TOOL, TIME_TOOL], gen)
        # tools without a system message: the default system prompt opens the tools block
        self.check(TOOL_CONVERSATION[1:], [WEATHER_TOOL], True)
        # tool messages and tool calls without a tools list
        self.check(TOOL_CONVERSATION, None, True)
        # an empty tools list is no tools
        self.check(SYSTEM_USER, [], True)

    def test_later_system_message(self):
        self.check(NO_SYSTEM + [{"role": "system", "content": "Now be brief."},
                                {"role": "user", "content": "ok"}], None, True)


@unittest.skipUnless(os.path.exists(CHAT_MODEL),
                     f"real chat model absent ({CHAT_MODEL or 'CAIRN_CHAT_MODEL unset'}); "
                     "fetch it with scripts/get-model")
class QwenOtherDefaultPrompt(ChatFormat, unittest.TestCase):
    """The real Qwen2.5 template with its default system sentence worded
    otherwise (as fine-tunes do): cairn must render the template's own
    sentence, never a copy of the stock one."""
    family = "qwen2"

    @classmethod
    def setUpClass(cls):
        r = gguf.GGUFReader(CHAT_MODEL)
        f = r.fields["tokenizer.chat_template"]
        stock = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
        real = bytes(f.parts[f.data[0]]).decode("utf-8")
        assert stock in real, "the real template's default prompt moved"
        cls.source = real.replace(stock, "You are Qwen, created by Alibaba Cloud. "
                                         "You answer in one short paragraph.")
        cls.bos, cls.eos = "<|endoftext|>", "<|im_end|>"
        cls.model = os.path.join(_tmpdir.name, "qwen_other_default.gguf")
        write_vocab_gguf(cls.model, cls.source,
                         ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], cls.bos, cls.eos,
                         add_bos=False)

    def test_default_prompt_is_the_templates(self):
        self.check(NO_SYSTEM, None, True)
        self.check(TOOL_CONVERSATION[1:], [WEATHER_TOOL], True)


if __name__ == "__main__":
    harness.main()
