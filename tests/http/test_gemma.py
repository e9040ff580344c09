#!/usr/bin/env python3
"""Gemma 3 (sliding-window layers) through the OpenAI facade on the real
Gemma 3 270M (CAIRN_GEMMA_MODEL, scripts/get-model gemma3-270m-q4_k_m):

- its GGUF has no chat template: the Gemma turn format is taken from the
  vocabulary, and a greedy reply equals llama.cpp 34af94cd's on the same
  file and prompt (recorded below; llama-server /completion with the same
  21 prompt tokens);
- a 3-turn conversation over a ~2k-token document, resent whole each turn
  as OpenAI clients do (four times the 512-token window of the local
  layers): every turn computes only its new tokens (cached >= history - 1),
  and its greedy replies equal a fresh server's;
- after a restart over the same --cache-dir, the last turn comes back from
  disk to within a page (cached >= history - 16) with the same reply.

Skips (exit 77) when the model file is absent. No timing thresholds.

usage: test_gemma.py CAIRN_BIN [unittest args...]
"""
import os
import sys
import unittest

import openai

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import HANG_GUARD_S, Server  # noqa: E402

[CAIRN] = harness.take_argv("CAIRN_BIN", usage=__doc__)
GEMMA = os.environ.get("CAIRN_GEMMA_MODEL", "")
if not os.path.exists(GEMMA):
    print(f"skipped: CAIRN_GEMMA_MODEL ({GEMMA or 'unset'}) is absent; "
          "scripts/get-model gemma3-270m-q4_k_m fetches it")
    sys.exit(77)

TESTDATA = os.environ.get("CAIRN_TESTDATA",
                          os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))
DOC = open(os.path.join(TESTDATA, "text", "gpl-3.txt"), encoding="utf-8").read()[:10000]
QUESTIONS = ["Who publishes this licence?", "What is the licence called?",
             "Can I sell copies of the program?"]
PAGE = 16  # cairn serve's default --page-size

# llama.cpp 34af94cd, llama-server on the same file, greedy, prompt
# "<start_of_turn>user\nWhat is the capital of Japan? Answer in one
# sentence.<end_of_turn>\n<start_of_turn>model\n" (BOS added: 21 tokens). Its
# first 13 tokens, whose runner-up trails by 0.7 or more in log-probability;
# the 14th is a near-tie (0.02) that the order of a float sum can flip.
JAPAN = [{"role": "user", "content": "What is the capital of Japan? Answer in one sentence."}]
JAPAN_LLAMA_CPP = "What is the capital of Japan? Answer in one sentence.\n"


class Gemma3(harness.ServerCase):
    TMP_PREFIX = "cairn-gemma-"

    def serve(self, *extra):
        srv = self.track(Server(CAIRN, ["-m", GEMMA, "--model-name", "gemma", *extra], http=True))
        client = openai.OpenAI(base_url=srv.http_url + "/v1", api_key="unused", max_retries=0,
                               timeout=HANG_GUARD_S)
        self.on_cleanup(client.close)
        return srv, client

    @staticmethod
    def ask(client, messages, n=24):
        r = client.chat.completions.create(model="gemma", messages=messages, max_tokens=n,
                                           temperature=0)
        return r.choices[0].message.content, r.usage

    def test_template_and_llama_cpp_reply(self):
        srv, client = self.serve()
        text, usage = self.ask(client, JAPAN, n=13)
        self.assertEqual(usage.prompt_tokens, 21)
        self.assertEqual(text, JAPAN_LLAMA_CPP)
        self.assertTrue(any("vocabulary has <start_of_turn>" in line for line in srv.log_lines),
                        srv.log())

    def test_conversation_over_a_document(self):
        cache_dir = os.path.join(self.tmp, "kv")
        srv, client = self.serve("--cache-dir", cache_dir)
        messages = [{"role": "system", "content": "Answer from this document.\n\n" + DOC}]
        replies, history = [], 0
        for turn, q in enumerate(QUESTIONS):
            messages.append({"role": "user", "content": q})
            text, usage = self.ask(client, messages)
            cached = usage.prompt_tokens_details.cached_tokens
            if turn == 0:
                self.assertGreater(usage.prompt_tokens, 4 * 512, "the window is not exercised")
            else:  # everything but the last token of what the previous turn held
                self.assertGreaterEqual(cached, history - 1, f"turn {turn}: {usage}")
            history = usage.prompt_tokens + usage.completion_tokens
            last_prompt = usage.prompt_tokens
            replies.append(text)
            messages.append({"role": "assistant", "content": text})
        srv.stop()

        # a fresh server (nothing cached) for each turn gives the same reply
        for turn in range(len(QUESTIONS)):
            fresh, fclient = self.serve()
            text, usage = self.ask(fclient, messages[:2 + 2 * turn])
            self.assertEqual(usage.prompt_tokens_details.cached_tokens, 0)
            self.assertEqual(text, replies[turn], f"turn {turn}: cached != fresh")
            fresh.stop()

        # a restart over the same cache directory: the last turn from disk,
        # to within a page
        srv, client = self.serve("--cache-dir", cache_dir)
        text, usage = self.ask(client, messages[:-1])
        self.assertEqual(usage.prompt_tokens, last_prompt)
        self.assertGreaterEqual(usage.prompt_tokens_details.cached_tokens, last_prompt - PAGE,
                                usage)
        self.assertEqual(text, replies[-1], "after a restart != before")


if __name__ == "__main__":
    harness.main()
