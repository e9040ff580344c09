#!/usr/bin/env python3
"""Suffix speculation and draft models inside `cairn serve --spec`, through
the real executable, the Python client (msgpack) and the HTTP API.

argv: CAIRN_BIN MODEL HEAD PYTHON TOOLS_DIR

A speculative step draws every token as plain decoding does (model.h), so
each check here compares a request with speculation to the same request
with `speculative: false` on the same server, token for token:

- greedy, seeded sampling, penalties, logprobs and a JSON-schema grammar,
  with --spec ngram (the old name of suffix; drafting every step:
  --spec-fixed) and with the adaptive controller, from one client and from
  concurrent ones;
- usage reports the method and tau over msgpack and HTTP; a request may
  name the methods that propose (`speculative: "suffix"`, or "ngram"), and
  naming one the server does not run is a clear error;
- suffix speculation learns from earlier requests of the same tenant only:
  a greedy request sent again by its tenant drafts its whole answer from
  the first one's output (tau up), another tenant's identical request
  drafts exactly what a first request did (same tau: it saw nothing), and
  with `suffix:0` (no corpus) the repeat gains nothing;
- suffix lookup keeps nothing in the pages: a prefix cached by a server
  without it is found by one with it after a restart (same namespace);
- a draft model (the target itself here, so every guess is taken) keeps its
  KV in the pages: greedy and sampled identical, sessions forked and
  truncated mid-page identical, its pages found again after a restart with
  it and never by a server without it; a draft model of another
  vocabulary, or a missing file, is refused at start with a message.
"""
import json
import os
import subprocess
import sys
import threading
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import SHORT_HANG_GUARD_S  # noqa: E402
from cairn_client import CairnError  # noqa: E402

cairn, model, head, python, tools = harness.take_argv("CAIRN_BIN", "MODEL", "HEAD", "PYTHON",
                                                     "TOOLS_DIR")
failures = 0
N = 64

# Prompts that quote themselves, as RAG and code-editing prompts do.
STORY = ("Once upon a time, there was a little girl named Lily. She loved to play outside "
         "in the park with her friends. One day, she saw a big red ball under a tree. ")
PROMPTS = [STORY + "Then she said: Once upon a time, there was a little girl named",
           STORY + "Lily wanted to play in the park with her friends. One day,",
           "Tom had a red ball. Tom had a red ball. Tom had a", "The sun was"]
SCHEMA = {"type": "json_schema", "json_schema": {"name": "flat", "schema": json.dumps(
    {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
     "required": ["n", "ok"]})}}


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what, flush=True)
    else:
        print("ok:", what, flush=True)


def same_both_ways(c, what, **kw):
    """The request with and without speculation; True when identical."""
    on = c.generate(**kw)
    off = c.generate(speculative=False, **kw)
    lp_same = on.raw.get("logprobs") == off.raw.get("logprobs")
    check(on.tokens == off.tokens and on.text == off.text and lp_same,
          "%s: speculative == plain (%d tokens)" % (what, len(on.tokens)))
    return on


# sessions forked and truncated mid-page: each branch continues as a
# plain server's would (method KV of shared and copied pages)
def branches(cl, **kw):
    sid = cl.session_open(text=STORY + STORY[:37])["session_id"]
    a = cl.session_generate(sid, max_tokens=24, temperature=0, **kw)
    fork = cl.session_fork(sid)
    b = cl.session_generate(fork, text=" Lily said", max_tokens=24, temperature=0.8, seed=2,
                            **kw)
    cl.session_truncate(sid, cl.session_info(sid)["n_tokens"] - 13)
    d = cl.session_generate(sid, text=" and", max_tokens=24, temperature=0, **kw)
    return [a.tokens, b.tokens, d.tokens]


def http_post(srv, path, body):
    req = urllib.request.Request(srv.http_url + path, data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=SHORT_HANG_GUARD_S) as r:
        return json.loads(r.read())


servers = harness.Scratch("cairn-spec2-")
ALICE = "alice-token-for-the-spec-test-5d1e9b"
BOB = "bob-token-for-the-spec-test-0a7c43e2"
cache = servers.path("cache")
base = ["-m", model, "-t", "1", "--cache-dir", cache, "--tier-loads", "always"]


def start(*extra, http=False):
    return servers.start(cairn, base + list(extra), start_timeout=SHORT_HANG_GUARD_S, http=http)


try:
    # ---- 1. --spec ngram, drafting every step -----------------------------
    srv = start("--spec", "ngram", "--spec-fixed", "--draft-max-batch", "2", http=True)
    c = srv.client(timeout=SHORT_HANG_GUARD_S)
    taus = []
    for i, p in enumerate(PROMPTS):
        r = same_both_ways(c, "greedy %d" % i, prompt=p, max_tokens=N, temperature=0)
        taus.append(r.usage.speculative.get("tau", 0))
    check(all(t >= 1 for t in taus) and max(taus) > 1.3,
          "usage.speculative reports tau (%s)" % ", ".join("%.2f" % t for t in taus))
    check(all(c.generate(prompt=p, max_tokens=8, temperature=0).usage.speculative.get("method")
              == "suffix" for p in PROMPTS[:1]), "usage.speculative names the method")
    for seed in (1, 2, 3):
        same_both_ways(c, "sampled, seed %d" % seed, prompt=PROMPTS[seed % 3], max_tokens=N,
                       temperature=0.9, top_k=40, top_p=0.95, seed=seed)
    same_both_ways(c, "repeat and frequency penalties", prompt=PROMPTS[2], max_tokens=N,
                   temperature=0, repeat_penalty=1.3, frequency_penalty=0.4)
    same_both_ways(c, "sampled with penalties", prompt=PROMPTS[0], max_tokens=N,
                   temperature=0.8, seed=11, presence_penalty=0.6)
    same_both_ways(c, "logprobs", prompt=PROMPTS[1], max_tokens=24, temperature=0,
                   logprobs=True, top_logprobs=3)
    g = same_both_ways(c, "json_schema grammar", prompt="The sun was", max_tokens=120,
                       temperature=0, response_format=SCHEMA)
    try:
        ok = isinstance(json.loads(g.text), dict)
    except ValueError:
        ok = False
    check(ok and g.finish_reason == "stop", "the grammar request gives a JSON object")
    # the grammar completes inside a multi-token step: the walk has fed the
    # matcher every token of the step before any is kept, so completion must
    # be asked after the last one, or the answer loses its closing tokens
    # (a tool call cut to '{"name": ..., "record_id": ' did, on the 1.5B)
    echo = {"type": "json_schema", "json_schema": {"name": "echo", "schema": json.dumps(
        {"type": "object", "properties": {"colour": {"enum": ["red", "green"]}},
         "required": ["colour"], "additionalProperties": False})}}
    e = same_both_ways(c, "grammar completed inside a speculative step",
                       prompt='The ball is {"colour": "red"}. ' * 6 + "The ball is", max_tokens=40,
                       temperature=0, response_format=echo)
    try:
        e_ok = json.loads(e.text) in ({"colour": "red"}, {"colour": "green"})
    except ValueError:
        e_ok = False
    check(e_ok and e.finish_reason == "stop" and e.usage.speculative.get("tau", 0) > 1,
          "a grammar answer copied by speculation is whole (%r, tau %.2f)"
          % (e.text, e.usage.speculative.get("tau", 0)))
    # per-request methods
    for name in ("suffix", "ngram"):
        r = c.generate(prompt=PROMPTS[0], max_tokens=N, temperature=0, speculative=name)
        check(r.usage.speculative.get("method") == "suffix",
              "speculative: \"%s\" speculates (suffix)" % name)
    for bad in ("eagle", "draft", ["ngram", "medusa"], 3):
        try:
            c.generate(prompt="hi", max_tokens=4, speculative=bad)
            check(False, "speculative: %r refused" % (bad,))
        except CairnError as e:
            check("speculative" in str(e), "speculative: %r refused (%s)" % (bad, e))
    # HTTP reports it too
    body = {"prompt": PROMPTS[2], "max_tokens": 32, "temperature": 0}
    on = http_post(srv, "/v1/completions", body)
    off = http_post(srv, "/v1/completions", dict(body, speculative=False))
    spec = on.get("usage", {}).get("speculative", {})
    check(on["choices"][0]["text"] == off["choices"][0]["text"] and spec.get("method") == "suffix"
          and spec.get("steps", 0) > 0 and "speculative" not in off.get("usage", {}),
          "HTTP: same text, usage.speculative %s" % spec)

    # concurrent clients: some steps batch, some speculate
    results, errors = {}, []

    def worker(k):
        try:
            cl = srv.client(timeout=SHORT_HANG_GUARD_S)
            for i in range(2):
                p = PROMPTS[(k + i) % len(PROMPTS)]
                n = N if (k + i) % 2 == 0 else N // 2
                results[(k, i)] = (p, n, cl.generate(prompt=p, max_tokens=n, temperature=0.7,
                                                     seed=k).tokens, k)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(not errors, "concurrent clients: no errors %s" % errors[:1])
    bad = [key for key, (p, n, toks, seed) in results.items()
           if toks != c.generate(prompt=p, max_tokens=n, temperature=0.7, seed=seed,
                                 speculative=False).tokens]
    check(len(results) == 10 and not bad, "concurrent seeded outputs == plain (%d requests)"
          % len(results))
    srv.stop()

    # ---- 1b. the corpus: earlier requests of the same tenant only --------
    fd = os.open(servers.path("tenants"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("alice %s\nbob %s\n" % (ALICE, BOB))
    ASK = "The sun was"  # copies nothing from itself
    taus = {}
    for corpus in ("suffix", "suffix:0"):
        srv = start("--spec", corpus, "--spec-fixed", "--tenants", servers.path("tenants"))
        alice = srv.client(timeout=SHORT_HANG_GUARD_S, auth_token=ALICE)
        bob = srv.client(timeout=SHORT_HANG_GUARD_S, auth_token=BOB)
        first = alice.generate(prompt=ASK, max_tokens=N, temperature=0)
        again = alice.generate(prompt=ASK, max_tokens=N, temperature=0)
        other = bob.generate(prompt=ASK, max_tokens=N, temperature=0)
        taus[corpus] = [r.usage.speculative.get("tau", 0) for r in (first, again, other)]
        check(first.tokens == again.tokens == other.tokens and len(first.tokens) == N,
              "%s: the three requests give the same %d tokens" % (corpus, len(first.tokens)))
        srv.stop()
    t1, t2, t3 = taus["suffix"]
    check(t2 > 2 * t1 and t2 > 4, "suffix: the tenant's repeat drafts from its first answer "
          "(tau %.2f, first %.2f)" % (t2, t1))
    check(t3 == t1, "suffix: another tenant's identical request sees none of it (tau %.2f, "
          "a first request's %.2f)" % (t3, t1))
    check(taus["suffix:0"] == [t1, t1, t1], "suffix:0: no corpus, no gain from a repeat (%s)"
          % taus["suffix:0"])

    # ---- 2. the adaptive controller: same tokens whatever it decides ------
    srv = start("--spec", "ngram")
    c = srv.client(timeout=SHORT_HANG_GUARD_S)
    check(branches(c) == branches(c, speculative=False),
          "suffix: session, fork and truncate branches == plain")
    # stop strings from the middle of the plain answer: a step that accepted
    # tokens past one must end where plain decoding ends
    for i in (0, 1):
        text = c.generate(prompt=PROMPTS[i], max_tokens=N, temperature=0,
                          speculative=False).text
        at = next(k for k in range(len(text) // 2, len(text) - 3)
                  if text.find(text[k:k + 3]) == k)  # its first occurrence
        stop = text[at:at + 3]
        r = same_both_ways(c, "suffix, stop %r" % stop, prompt=PROMPTS[i], max_tokens=N,
                           temperature=0, stop=[stop])
        check(r.finish_reason == "stop" and 4 < len(r.tokens) < N,
              "suffix: the stop %r ended the answer after %d tokens" % (stop, len(r.tokens)))
    for i, p in enumerate(PROMPTS[:3]):
        same_both_ways(c, "adaptive, greedy %d" % i, prompt=p, max_tokens=2 * N, temperature=0)
        same_both_ways(c, "adaptive, sampled %d" % i, prompt=p, max_tokens=N, temperature=0.8,
                       seed=5 + i)
    srv.stop()

    # ---- 3. n-gram lookup keeps the namespace: pages cross restarts -------
    srv = start()
    c = srv.client(timeout=SHORT_HANG_GUARD_S)
    plain = c.generate(prompt=PROMPTS[0], max_tokens=N, temperature=0)
    srv.stop()
    srv = start("--spec", "ngram")
    c = srv.client(timeout=SHORT_HANG_GUARD_S)
    r = c.generate(prompt=PROMPTS[0], max_tokens=N, temperature=0)
    check(r.usage.cached_tokens >= 32 and r.tokens == plain.tokens,
          "pages cached without --spec ngram are used with it (%d cached), same tokens"
          % r.usage.cached_tokens)
    srv.stop()

    # ---- 4. a draft model ---------------------------------------------------
    srv = start("--spec", "draft:" + model, "--spec-fixed")
    c = srv.client(timeout=SHORT_HANG_GUARD_S)
    for i, p in enumerate(PROMPTS):
        r = same_both_ways(c, "draft model, greedy %d" % i, prompt=p, max_tokens=N,
                           temperature=0)
    check(r.usage.speculative.get("method") == "draft" and r.usage.speculative.get("tau", 0) > 4,
          "the target as its own draft model: every guess taken (%s)" % r.usage.speculative)
    same_both_ways(c, "draft model, sampled", prompt=PROMPTS[1], max_tokens=N, temperature=0.9,
                   seed=4)
    sid = c.session_open(text=STORY)["session_id"]
    t1 = c.session_generate(sid, max_tokens=20, temperature=0)
    t2 = c.session_generate(sid, text=" Then", max_tokens=20, temperature=0)
    check(t2.usage.cached_tokens >= 64, "draft model: a session's second turn from the cache "
          "(%d cached)" % t2.usage.cached_tokens)
    # a prompt of whole pages no other server here computes
    ONLY = ("Max the dog ran to the big tree in the park and barked at a bird on a branch. "
            "The bird flew away and Max sat down under the tree to rest in the shade. ")
    first = c.generate(prompt=ONLY, max_tokens=N, temperature=0)

    with_spec = branches(c)
    without = branches(c, speculative=False)
    check(with_spec == without, "draft model: fork and truncate branches == plain")
    # a request that never speculates leaves its pages without draft rows
    # (their stamps say so, its partial last page's too when cached); a
    # request continuing from its pages computes the missing rows and
    # drafts with them: the target as its own draft takes every guess only
    # if every one of those rows is right
    LAZY = ("Sue had a little cat named Tom. Tom liked to sleep in the sun by the window "
            "and play with a ball of red wool in the kitchen. ")
    p_tok = c.tokenize(LAZY)
    lazy = c.generate(tokens=p_tok, max_tokens=45, temperature=0, speculative=False)
    cont = c.generate(tokens=p_tok + lazy.tokens, max_tokens=40, temperature=0)
    plain_cont = c.generate(tokens=p_tok + lazy.tokens, max_tokens=40, temperature=0,
                            speculative=False)
    spec = cont.usage.speculative
    check(cont.usage.cached_tokens >= len(p_tok) + len(lazy.tokens) - 16 and
          cont.tokens == plain_cont.tokens and spec.get("drafted") == spec.get("accepted") and
          spec.get("tau", 0) > 6,
          "draft model: rows computed lazily, after the pages were cached, are right "
          "(%d cached, %s)"
          % (cont.usage.cached_tokens, spec))
    srv.stop()
    srv = start("--spec", "draft:" + model)
    c = srv.client(timeout=SHORT_HANG_GUARD_S)
    r = c.generate(prompt=ONLY, max_tokens=N, temperature=0)
    check(r.usage.cached_tokens >= 32 and r.tokens == first.tokens,
          "draft model: its pages found again after a restart (%d cached)"
          % r.usage.cached_tokens)
    # adaptive (pauses and lazy catch-up as it decides): branches as plain
    check(branches(c) == without, "draft model, adaptive: fork and truncate branches == plain")
    srv.stop()
    srv = start()
    c = srv.client(timeout=SHORT_HANG_GUARD_S)
    r = c.generate(prompt=ONLY, max_tokens=N, temperature=0)
    check(r.usage.cached_tokens == 0 and r.tokens == first.tokens,
          "pages with draft-model KV are never used without it (%d cached)"
          % r.usage.cached_tokens)
    srv.stop()

    # ---- 5. refused at start ------------------------------------------------
    other = servers.path("vocab600.gguf")
    subprocess.run([python, os.path.join(tools, "gen_synthetic_model.py"), "--shape", "tiny",
                    "--type", "F32", "--vocab", "600", "--seed", "9", "-o", other], check=True,
                   capture_output=True, timeout=SHORT_HANG_GUARD_S)
    for spec, want in (("draft:" + other, "vocabulary"), ("draft:/nonexistent.gguf", "draft"),
                       ("bogus:x", "unknown method"), ("medusa:/nonexistent.gguf", "Medusa heads"),
                       ("ngram,ngram", "twice")):
        r = subprocess.run([cairn, "serve", "-m", model, "-t", "1", "--port", "0", "--spec", spec],
                           capture_output=True, text=True, timeout=SHORT_HANG_GUARD_S)
        check(r.returncode != 0 and want in r.stderr,
              "--spec %s refused: %s" % (spec, r.stderr.strip().splitlines()[-1:]))
finally:
    servers.close()

print("failures:", failures)
sys.exit(1 if failures else 0)
