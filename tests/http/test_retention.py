#!/usr/bin/env python3
"""Retention hints (issue 36): clients say which prefix to keep, through the
real `cairn serve` on the real instruct model with the official `anthropic`
and `openai` packages:

- bad hints are 400s naming the field, as the APIs cairn copies answer:
  Anthropic's cache_control with an unknown ttl or type, a fifth
  breakpoint, a '1h' after a '5m', one on a thinking block, on a message,
  or not an object; OpenAI's prompt_cache_retention other than in_memory /
  24h; cairn's cache_pin with a bad ttl_s;
- Anthropic's usage means what Anthropic says: the first call with a
  breakpoint writes the prefix (cache_creation_input_tokens, split by TTL in
  cache_creation), the same call again reads it, and input_tokens +
  cache_creation_input_tokens + cache_read_input_tokens is the prompt;
- a pinned document survives a flood of one-off prompts larger than tier 0
  and the host tier together (no disk tier), while an unpinned prompt of
  that flood does not; after its TTL (cache_pin's ttl_s, seconds) the pin is
  released (/metrics cairn_pinned_tokens) and the next flood evicts it like
  any page;
- prompt_cache_retention "24h" pins the prompt (cairn_pinned_tokens), and a
  tenant pinning past --max-pinned-tokens gets a 429 naming the bound, while
  refreshing what it pins already is never refused.

usage: test_retention.py CAIRN_BIN [unittest args...]
  runs on CAIRN_CHAT_MODEL (skips, 77, when that file or a client package is
  absent)
"""
import os
import random
import sys
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import HANG_GUARD_S  # noqa: E402
from metrics import parse_metrics  # noqa: E402

(CAIRN,) = harness.take_argv("CAIRN_BIN", usage=__doc__)
CHAT_MODEL = os.environ.get("CAIRN_CHAT_MODEL", "")
if not os.path.exists(CHAT_MODEL):
    print(f"skipped: CAIRN_CHAT_MODEL ({CHAT_MODEL or 'unset'}) is absent; "
          "scripts/get-model fetches it")
    sys.exit(77)
try:
    import anthropic
    import openai
except ImportError:
    print("skipped: the anthropic and openai packages are needed (scripts/setup.sh --test)")
    sys.exit(77)

PAGE = 16  # tokens per page (the default --page-size)
# Small tiers so that a flood is cheap: 24 MiB of f16 KV is 128 pages (2048
# tokens) of this model, 8 MiB of host RAM 42 pages; no disk tier.
SMALL = ["-c", "1024", "--kv-mem", "24M", "--host-mem", "8M"]

WORDS = ("page pool radix tree scheduler tokenizer sampler session record disk tier host "
         "slot prefix cache eviction promotion batch request reply stream grammar router "
         "replica tenant budget deadline checksum namespace kernel layer head window").split()


def text(seed, n_sentences):
    """Deterministic prose that differs for every seed from its first words
    (so two texts share no page), about 14 tokens a sentence."""
    rnd = random.Random(seed)
    out = ["Note %d." % seed]
    for i in range(n_sentences):
        a, b, c = rnd.sample(WORDS, 3)
        out.append("The %s %s the %s %d times in step %d." % (a, b, c, rnd.randrange(1000), i))
    return " ".join(out)


def metrics(srv):
    with urllib.request.urlopen(srv.http_url + "/metrics", timeout=HANG_GUARD_S) as f:
        return parse_metrics(f.read().decode())[0]


def clients(srv):
    # no retries: a 429 is the answer under test, not something to wait out
    return (anthropic.Anthropic(base_url=srv.http_url, api_key="unused", max_retries=0,
                                timeout=HANG_GUARD_S),
            openai.OpenAI(base_url=srv.http_url + "/v1", api_key="unused", max_retries=0,
                          timeout=HANG_GUARD_S))


def ask_doc(ac, doc, question, ttl=None, max_tokens=1):
    """An Anthropic call whose system block (the document) is a breakpoint."""
    cc = {"type": "ephemeral"}
    if ttl:
        cc["ttl"] = ttl
    return ac.messages.create(model="m", max_tokens=max_tokens,
                              system=[{"type": "text", "text": doc, "cache_control": cc}],
                              messages=[{"role": "user", "content": question}])


def completion_cached(oc, prompt, **extra):
    r = oc.completions.create(model="m", prompt=prompt, max_tokens=1, temperature=0,
                              extra_body=extra or None)
    return r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens


class BadHints(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.scratch = cls.class_scratch()
        cls.srv = cls.scratch.start(CAIRN, ["-m", CHAT_MODEL, "-c", "1024"], http=True)
        cls.ac, cls.oc = clients(cls.srv)

    def refused(self, field, **body):
        body.setdefault("messages", [{"role": "user", "content": "hi"}])
        with self.assertRaises(anthropic.BadRequestError) as cm:
            self.ac.messages.create(model="m", max_tokens=1, **body)
        self.assertEqual(cm.exception.status_code, 400)
        self.assertEqual(cm.exception.body["error"]["type"], "invalid_request_error")
        self.assertIn(field + ":", cm.exception.body["error"]["message"])

    def test_cache_control_refused(self):
        eph = {"type": "ephemeral"}
        block = lambda cc: {"type": "text", "text": "hi", "cache_control": cc}  # noqa: E731
        self.refused("system.0.cache_control.ttl",
                     system=[block({"type": "ephemeral", "ttl": "2h"})])
        self.refused("messages.0.content.0.cache_control.type",
                     messages=[{"role": "user", "content": [block({"type": "persistent"})]}])
        self.refused("messages.0.content.0.cache_control",
                     messages=[{"role": "user", "content": [block("ephemeral")]}])
        self.refused("messages.0.content.4.cache_control",
                     messages=[{"role": "user", "content": [block(eph) for _ in range(5)]}])
        self.refused("messages.0.content.0.cache_control.ttl",
                     system=[block(eph)],
                     messages=[{"role": "user",
                                "content": [block({"type": "ephemeral", "ttl": "1h"})]}])
        self.refused("messages.1.content.0.cache_control",
                     messages=[{"role": "user", "content": "hi"},
                               {"role": "assistant", "content": [
                                   {"type": "thinking", "thinking": "hm", "signature": "x",
                                    "cache_control": eph}]},
                               {"role": "user", "content": "go on"}])
        self.refused("messages.0.cache_control",
                     messages=[{"role": "user", "content": "hi", "cache_control": eph}])
        self.refused("tools.0.cache_control.ttl",
                     tools=[{"name": "f", "input_schema": {"type": "object"},
                             "cache_control": {"type": "ephemeral", "ttl": 300}}])
        self.refused("cache_control.type", extra_body={"cache_control": {"type": "auto"}})
        # the same breakpoints, well formed, are served
        r = self.ac.messages.create(model="m", max_tokens=1, system=[block(eph)],
                                    messages=[{"role": "user", "content": [block(eph)]}],
                                    extra_body={"cache_control": eph})
        self.assertEqual(r.type, "message")

    def test_retention_refused(self):
        for route in ("chat", "completions"):
            with self.subTest(route=route):
                with self.assertRaises(openai.BadRequestError) as cm:
                    if route == "chat":
                        self.oc.chat.completions.create(
                            model="m", max_tokens=1, messages=[{"role": "user", "content": "x"}],
                            extra_body={"prompt_cache_retention": "forever"})
                    else:
                        self.oc.completions.create(
                            model="m", max_tokens=1, prompt="x",
                            extra_body={"prompt_cache_retention": "24 h"})
                self.assertIn("prompt_cache_retention", str(cm.exception))
        with self.assertRaises(openai.BadRequestError) as cm:
            self.oc.responses.create(model="m", input="x", max_output_tokens=16,
                                     extra_body={"prompt_cache_retention": 24})
        self.assertIn("prompt_cache_retention", str(cm.exception))
        for pin, field in (({"ttl_s": 0}, "cache_pin.ttl_s"), ({"ttl_s": 1e9}, "cache_pin.ttl_s"),
                           ({"ttl_s": 5, "tokens": 0}, "cache_pin.tokens"), (7, "cache_pin")):
            with self.subTest(pin=pin):
                with self.assertRaises(openai.BadRequestError) as cm:
                    self.oc.completions.create(model="m", max_tokens=1, prompt="x",
                                               extra_body={"cache_pin": pin})
                self.assertIn(field, str(cm.exception))


class Usage(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.scratch = cls.class_scratch()
        cls.srv = cls.scratch.start(CAIRN, ["-m", CHAT_MODEL, "-c", "2048"], http=True)
        cls.ac, cls.oc = clients(cls.srv)

    def check(self, ttl, seed):
        doc = text(seed, 20)
        u1 = ask_doc(self.ac, doc, "What is in step 3?", ttl=ttl).usage
        u2 = ask_doc(self.ac, doc, "What is in step 3?", ttl=ttl).usage
        total = u1.input_tokens + u1.cache_creation_input_tokens + u1.cache_read_input_tokens
        self.assertEqual(total, u2.input_tokens + u2.cache_creation_input_tokens +
                         u2.cache_read_input_tokens)
        # first: the document is written, nothing of it read (the template's
        # first few tokens may be, from part of another test's first page);
        # the breakpoint's prefix is kept in whole pages
        self.assertLess(u1.cache_read_input_tokens, PAGE)
        self.assertGreater(u1.cache_creation_input_tokens, 200)
        self.assertEqual((u1.cache_creation_input_tokens + u1.cache_read_input_tokens) % PAGE, 0)
        self.assertGreater(u1.input_tokens, 0)  # the question, after the breakpoint
        split = u1.cache_creation.model_dump() if u1.cache_creation else {}
        want = {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0}
        want["ephemeral_%s_input_tokens" % (ttl or "5m")] = u1.cache_creation_input_tokens
        self.assertEqual(split, want)
        # again: the prefix is read, nothing written
        self.assertGreaterEqual(u2.cache_read_input_tokens, u1.cache_creation_input_tokens)
        self.assertEqual(u2.cache_creation_input_tokens, 0)
        self.assertEqual(u2.input_tokens, total - u2.cache_read_input_tokens)
        return total

    def test_five_minutes(self):
        self.check(None, 1)

    def test_one_hour(self):
        self.check("1h", 2)

    def test_top_level_and_tools(self):
        # top level: automatic caching, the breakpoint on the last block (the
        # whole conversation); a tool's: the preamble with the tool list
        doc = text(5, 20)
        tool = {"name": "lookup", "description": "Looks a step up.",
                "input_schema": {"type": "object", "properties": {"step": {"type": "integer"}}},
                "cache_control": {"type": "ephemeral", "ttl": "1h"}}
        body = dict(model="m", max_tokens=1, tools=[tool],
                    messages=[{"role": "user", "content": doc}],
                    extra_body={"cache_control": {"type": "ephemeral"}})
        u1 = self.ac.messages.create(**body).usage
        u2 = self.ac.messages.create(**body).usage
        # (without a system text the template writes its default one, which
        # other tests' prompts share)
        self.assertLess(u1.cache_read_input_tokens, 2 * PAGE)
        # the whole prompt but the part of a page after the last whole one
        self.assertGreater(u1.cache_creation_input_tokens, 250)
        self.assertLess(u1.input_tokens, 2 * PAGE)
        split = u1.cache_creation.model_dump()
        self.assertGreater(split["ephemeral_1h_input_tokens"], 0)  # the tool list
        self.assertGreater(split["ephemeral_5m_input_tokens"], 200)  # the document
        self.assertEqual(u2.cache_creation_input_tokens, 0)
        self.assertGreaterEqual(u2.cache_read_input_tokens, u1.cache_creation_input_tokens)

    def test_breakpoint_inside_a_message(self):
        # a user message [tool_result, text]: a breakpoint on the tool_result
        # ends with its tool message, before the text; one on the text ends
        # with the user message after it
        eph = {"type": "ephemeral"}

        def ask(on_result, seed):
            result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": text(6, 15)}
            after = {"type": "text", "text": text(seed, 15)}
            (result if on_result else after)["cache_control"] = eph
            u = self.ac.messages.create(model="m", max_tokens=1, messages=[
                {"role": "user", "content": "Read the log."},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1",
                                                   "name": "read_log", "input": {}}]},
                {"role": "user", "content": [result, after]}]).usage
            self.assertGreater(u.cache_creation_input_tokens, 0)
            return u.cache_creation_input_tokens + u.cache_read_input_tokens
        # the second call reads what the first wrote up to the tool message,
        # and writes its own text
        on_result, on_text = ask(True, 7), ask(False, 8)
        self.assertGreater(on_result, 200)
        self.assertGreater(on_text - on_result, 150)  # the text's ~210 tokens

    def test_without_breakpoint(self):
        for _ in range(2):
            r = self.ac.messages.create(model="m", max_tokens=1,
                                        messages=[{"role": "user", "content": text(3, 10)}])
            self.assertEqual(r.usage.cache_creation_input_tokens, 0)
        # the second time the prompt was read from the cache all the same
        self.assertGreater(r.usage.cache_read_input_tokens, 100)

    def test_streamed(self):
        doc = text(4, 20)
        with self.ac.messages.stream(model="m", max_tokens=2, system=[
                {"type": "text", "text": doc, "cache_control": {"type": "ephemeral"}}],
                messages=[{"role": "user", "content": "Step 1?"}]) as s:
            first = s.get_final_message().usage
        self.assertGreater(first.cache_creation_input_tokens, 200)
        u = ask_doc(self.ac, doc, "Step 1?").usage
        self.assertEqual(u.cache_creation_input_tokens, 0)
        self.assertGreaterEqual(u.cache_read_input_tokens, first.cache_creation_input_tokens)


class Flood(harness.TestCase):
    """A pinned prefix against a flood larger than tier 0 + host RAM."""

    def flood(self, oc, seed, n=5):
        """n one-off prompts of ~700 tokens each (3.5k tokens: more than the
        2048 + 672 tokens the two tiers hold); the first one's text."""
        prompts = [text(seed + i, 50) for i in range(n)]
        for p in prompts:
            completion_cached(oc, p)
        return prompts[0]

    def test_pinned_document_survives_then_expires(self):
        with harness.Scratch() as scratch:
            srv = scratch.start(CAIRN, ["-m", CHAT_MODEL, *SMALL, "--max-pinned-tokens", "1024"],
                                http=True)
            ac, oc = clients(srv)
            doc = text(100, 50)
            first = ask_doc(ac, doc, "What happens in step 7?").usage
            pinned = first.cache_creation_input_tokens
            self.assertGreater(pinned, 500)
            self.assertEqual(metrics(srv)["cairn_pinned_tokens"], pinned)

            one_off = self.flood(oc, 1000)
            m = metrics(srv)
            self.assertGreater(m["cairn_kv_evicted_pages_total"], 0)
            # an unpinned prompt of the flood was pushed out of both tiers ...
            n, cached = completion_cached(oc, one_off)
            self.assertLess(cached, n // 2, "the flood did not exceed the tiers")
            # ... the pinned document was not
            again = ask_doc(ac, doc, "And in step 9?").usage
            self.assertGreaterEqual(again.cache_read_input_tokens, pinned - PAGE)
            self.assertEqual(again.cache_creation_input_tokens, 0)

            # cairn's cache_pin with a TTL of seconds: kept, then released
            doc2 = text(200, 14)  # both pins within half the pool (1024 tokens)
            n2, _ = completion_cached(oc, doc2, cache_pin={"ttl_s": 15})
            m = metrics(srv)
            self.assertEqual(m["cairn_pinned_tokens"], pinned + n2 // PAGE * PAGE)
            self.assertEqual(m["cairn_pinned_prefixes"], 2)
            m = harness.poll(lambda: metrics(srv),
                             lambda m: m["cairn_pinned_prefixes"] == 1, guard=60, every=0.5)
            self.assertEqual(m["cairn_pinned_tokens"], pinned, "the pin was not released")
            self.flood(oc, 2000)
            _, cached = completion_cached(oc, doc2)
            self.assertLess(cached, n2 // 2, "an expired pin still kept its prefix")
            again = ask_doc(ac, doc, "And in step 2?").usage
            self.assertGreaterEqual(again.cache_read_input_tokens, pinned - PAGE)


class Bound(harness.TestCase):
    def test_tenant_bound_and_24h(self):
        with harness.Scratch() as scratch:
            srv = scratch.start(CAIRN, ["-m", CHAT_MODEL, "-c", "1024",
                                        "--max-pinned-tokens", "400"], http=True)
            ac, oc = clients(srv)
            a, b, big = text(300, 12), text(301, 12), text(302, 40)

            def chat24(content):
                return oc.chat.completions.create(
                    model="m", max_tokens=1, temperature=0,
                    messages=[{"role": "user", "content": content}],
                    extra_body={"prompt_cache_retention": "24h"})
            r = chat24(a)
            held = metrics(srv)["cairn_pinned_tokens"]
            self.assertEqual(held, r.usage.prompt_tokens // PAGE * PAGE)
            self.assertGreater(held, 100)
            # "in_memory" is the default caching: no pin
            oc.chat.completions.create(model="m", max_tokens=1,
                                       messages=[{"role": "user", "content": b}],
                                       extra_body={"prompt_cache_retention": "in_memory"})
            self.assertEqual(metrics(srv)["cairn_pinned_tokens"], held)
            # past the bound: 429, naming it, on both APIs; nothing pinned
            with self.assertRaises(openai.RateLimitError) as cm:
                chat24(big)
            self.assertIn("already pins %d tokens" % held, str(cm.exception))
            self.assertIn("400", str(cm.exception))
            with self.assertRaises(anthropic.RateLimitError) as cm:
                ask_doc(ac, big, "Step 4?")
            self.assertEqual(cm.exception.status_code, 429)
            self.assertIn("--max-pinned-tokens", cm.exception.body["error"]["message"])
            m = metrics(srv)
            self.assertEqual(m["cairn_pinned_tokens"], held)
            self.assertEqual(m["cairn_pins_refused_total"], 2)
            # refreshing what is pinned already is never refused
            chat24(a)
            self.assertEqual(metrics(srv)["cairn_pinned_tokens"], held)
            # and the same request without a hint is served as ever
            oc.chat.completions.create(model="m", max_tokens=1,
                                       messages=[{"role": "user", "content": big}])



class Native(harness.TestCase):
    """The native protocol's cache_pin, through the Python client."""

    def test_cache_pin(self):
        from cairn_client import InvalidRequest, Overloaded
        with harness.Scratch() as scratch:
            srv = scratch.start(CAIRN, ["-m", CHAT_MODEL, "-c", "1024",
                                        "--max-pinned-tokens", "256"], http=True)
            c = scratch.client(srv)
            doc = text(400, 12)
            r = c.call("generate", {"prompt": doc, "max_tokens": 1, "temperature": 0,
                                    "cache_pin": {"ttl_s": 15, "tokens": 100}})
            st = c.cache_stats()
            self.assertEqual((st["pinned_tokens"], st["pinned_prefixes"]), (96, 1))
            # past the bound: refused, naming it; the pin already held stays
            with self.assertRaises(Overloaded) as cm:
                c.call("generate", {"prompt": text(401, 20), "max_tokens": 1,
                                    "cache_pin": {"ttl_s": 60}})
            self.assertIn("bound of 256", cm.exception.message)
            self.assertEqual(c.cache_stats()["pins_refused"], 1)
            with self.assertRaises(InvalidRequest) as cm:
                c.call("generate", {"prompt": doc, "max_tokens": 1, "cache_pin": {"ttl_s": -1}})
            self.assertIn("cache_pin.ttl_s", cm.exception.message)
            # its TTL later it is released
            st = harness.poll(c.cache_stats, lambda st: st["pinned_prefixes"] == 0, guard=60,
                              every=0.5)
            self.assertEqual(st["pinned_tokens"], 0, "the pin was not released")
            self.assertGreater(r["usage"]["prompt_tokens"], 100)


if __name__ == "__main__":
    harness.main()
