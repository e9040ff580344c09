"""Replies forced to a given text on a small model, and the HTTP helpers the
reasoning tests share (test_harmony.py, test_thinking.py).

A reply is forced by a json_schema `const`: the model writes that text as a
JSON string, quotes included, which is how a reply in a format no small
model writes (harmony's channels, <think> blocks) reaches the server's
readers."""
import json
import os
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

import harness
from harness import SHORT_HANG_GUARD_S, Server


class TemplateServerCase(harness.TestCase):
    """A server of `model` given the chat template in the file `template`
    (written into a copy of the GGUF), over HTTP, for the class's tests."""
    binary = model = template = None

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.templated = os.path.join(cls.tmp.name, "templated.gguf")
        subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata",
                        "--chat-template-file", cls.template, "--force", cls.model,
                        cls.templated],
                       check=True, capture_output=True, timeout=120)
        cls.server = Server(cls.binary, ["-m", cls.templated], http=True,
                            start_timeout=SHORT_HANG_GUARD_S)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.tmp.cleanup()


def post(url, body, path="/v1/chat/completions"):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=SHORT_HANG_GUARD_S) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def forced(text, **kw):
    body = {"model": "m", "max_tokens": 300, "temperature": 0,  # (the JSON's spaces)
            "messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": "Hi"}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "reply", "schema": {"const": text}}}}
    body.update(kw)
    return body


def sse(text):
    """The JSON events of a server-sent event stream, in order."""
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def forced_response(text, **kw):
    """A Responses API body whose reply is forced to `text` (as forced())."""
    body = {"model": "m", "max_output_tokens": 300, "temperature": 0,  # (the JSON's spaces)
            "instructions": "Be brief.", "input": "Hi",
            "text": {"format": {"type": "json_schema", "name": "reply",
                                "schema": {"const": text}}}}
    body.update(kw)
    return body


def forced_message(text, **kw):
    """An Anthropic Messages body whose reply is forced to `text`, through
    structured outputs (output_format)."""
    body = {"model": "m", "max_tokens": 300, "temperature": 0, "system": "Be brief.",
            "messages": [{"role": "user", "content": "Hi"}],
            "output_format": {"type": "json_schema", "schema": {"const": text}}}
    body.update(kw)
    return body


def official(module):
    try:
        return __import__(module)
    except ImportError:
        return None
