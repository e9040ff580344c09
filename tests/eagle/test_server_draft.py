#!/usr/bin/env python3
"""EAGLE speculative decoding inside `cairn serve --draft`, through the real
executable and the Python client.

argv: CAIRN_BIN MODEL HEAD

- greedy outputs with speculation (the default with a head) equal the same
  requests with `speculative: false`, and `cairn run` without a head, for
  several prompts that share a long prefix (so their pages are shared);
- the same from several concurrent clients on a server that speculates only
  while at most 2 requests decode (so some steps batch, some speculate),
  with a grammar request and a per-request `draft` tree alongside;
- a session's second turn is served from the cache with speculation and
  gives what a server without the head gives;
- restarts over one --cache-dir: pages written with the head are found again
  with it; a server without the head never finds them, and pages it writes
  are never found by a server with the head (namespace), outputs identical
  throughout;
- bad `draft` values are refused; --draft-max-batch 0 serves without
  speculating;
- with too few KV pages, requests are paused and resumed (re-adopted from
  the cache) while speculating, outputs unchanged.
"""
import json
import os
import re
import subprocess
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import SHORT_HANG_GUARD_S  # noqa: E402
from cairn_client import CairnError  # noqa: E402

cairn, model, head = harness.take_argv("CAIRN_BIN", "MODEL", "HEAD")
failures = 0
N = 60  # tokens per generation

# A shared prefix of several pages (16 tokens each), then different endings.
STORY = ("Once upon a time, there was a little girl named Lily. She loved to play outside "
         "in the park with her friends. One day, she saw a big red ball under a tree. ")
PROMPTS = [STORY + "She", STORY + "Lily wanted to", STORY + "Her mom said", "Tom had a red ball",
           "The sun was"]
OTHER = "One day a little dog named Max found a big stick in the garden and ran to his friend"


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what, flush=True)
    else:
        print("ok:", what, flush=True)


def run_plain(prompt):
    r = subprocess.run([cairn, "run", "-m", model, "-p", prompt, "-n", str(N), "--temp", "0",
                        "-t", "1"], capture_output=True, text=True, timeout=SHORT_HANG_GUARD_S)
    assert r.returncode == 0, r.stderr
    return r.stdout[:-1] if r.stdout.endswith("\n") else r.stdout  # run ends with a newline


def spec_steps(srv):
    """(speculative steps, tokens) from the log line a stopped server writes
    (once stop() has returned, log_lines holds all of its stderr)."""
    for line in srv.log_lines:
        m = re.search(r"(\d+) speculative steps gave (\d+) tokens", line)
        if m:
            return int(m.group(1)), int(m.group(2))
    return None


expected = {p: run_plain(p) for p in PROMPTS + [OTHER]}
servers = harness.Scratch("cairn-spec-")  # every server started, killed at the end
cache = servers.path("cache")
base = ["-m", model, "-t", "1", "--cache-dir", cache, "--tier-loads", "always"]


def start(*extra):
    return servers.start(cairn, base + list(extra), start_timeout=SHORT_HANG_GUARD_S)


try:
    # ---- 1. one client: on, off, per-request draft, bad draft -------------
    srv = start("--draft", head, "--draft-max-batch", "2")
    c = srv.client(timeout=SHORT_HANG_GUARD_S)
    for p in PROMPTS:
        on = c.generate(p, max_tokens=N, temperature=0)
        off = c.generate(p, max_tokens=N, temperature=0, speculative=False)
        check(on.text == expected[p], "speculative greedy == cairn run for %r" % p[-20:])
        check(off.text == expected[p], "speculative: false == cairn run for %r" % p[-20:])
    small = c.generate(PROMPTS[0], max_tokens=N, temperature=0,
                       draft={"depth": 2, "top_k": 2, "n": 3})
    check(small.text == expected[PROMPTS[0]], "per-request draft tree: same greedy text")
    # a logit bias is part of what the draft is checked against: greedy
    # with a banned favourite is the same speculated or not
    fav = c.generate(PROMPTS[1], max_tokens=1, temperature=0, speculative=False).tokens[0]
    biased = [c.generate(PROMPTS[1], max_tokens=N, temperature=0, speculative=spec,
                         logit_bias={fav: -100, 400: 2.5}).tokens for spec in (True, False)]
    check(biased[0] == biased[1] and biased[0][0] != fav,
          "logit_bias: speculative greedy == plain greedy")
    for bad in ({"depth": 0}, {"top_k": 17}, {"n": 256}, {"n": "x"}):
        try:
            c.generate("hi", max_tokens=4, temperature=0, draft=bad)
            check(False, "draft %r refused" % bad)
        except CairnError:
            check(True, "draft %r refused" % bad)
    # Prompts that part exactly at a page boundary (token 48): the later ones
    # take pages 0-2 from the first, whose last head row was computed with
    # another next token. Sampled outputs depend on the draft trees, and
    # those must not depend on who computed a shared page (model/model.h).
    base48 = c.tokenize(STORY, add_bos=True)[:48]
    split = [base48 + c.tokenize(" " + e, add_bos=False)
             for e in ("She ran", "Lily wanted to", "Her mom said")]
    sampled = [c.generate(tokens=t, max_tokens=N, temperature=0.8, seed=3) for t in split]
    check(all(r.finish_reason in ("length", "stop") and r.tokens for r in sampled),
          "sampled requests with speculation run")
    check(all(r.usage.cached_tokens == 48 for r in sampled[1:]),
          "prompts parting at a page boundary share 3 pages")

    ref = start("--draft", head, "--no-prefix-cache")
    rc = ref.client(timeout=SHORT_HANG_GUARD_S)
    fresh = [rc.generate(tokens=t, max_tokens=N, temperature=0.8, seed=3).tokens for t in split]
    ref.stop()
    check(fresh == [r.tokens for r in sampled],
          "sampled speculative outputs: from shared pages == computed fresh")

    # ---- 2. concurrent clients: some steps batch, some speculate ----------
    results, errors = {}, []
    rf = {"type": "json_schema", "json_schema": {"name": "flat", "schema": json.dumps(
        {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
         "required": ["n", "ok"]})}}

    def worker(k):
        try:
            cl = srv.client(timeout=SHORT_HANG_GUARD_S)
            for i in range(2):
                p = PROMPTS[(k + i) % len(PROMPTS)]
                # lengths differ so the number of decoding requests changes
                n = N if (k + i) % 2 == 0 else N // 2
                r = cl.generate(p, max_tokens=n, temperature=0)
                results[(k, i)] = (p, n, r.tokens)
            if k == 0:
                g = cl.generate("The sun was", max_tokens=200, temperature=0,
                                response_format=rf)
                results["grammar"] = g.text
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(not errors, "concurrent clients: no errors %s" % errors[:1])
    full = {p: c.generate(p, max_tokens=N, temperature=0, speculative=False).tokens
            for p in PROMPTS}
    bad = [key for key, v in results.items() if key != "grammar" and v[2] != full[v[0]][:v[1]]]
    check(len(results) >= 10 and not bad, "concurrent greedy outputs == plain (%d requests)"
          % (len(results) - 1))
    g_ref = c.generate("The sun was", max_tokens=200, temperature=0, response_format=rf,
                       speculative=False)
    gtext = results.get("grammar")
    check(gtext == g_ref.text, "grammar request alongside: same text as alone")
    try:
        ok = g_ref.finish_reason == "stop" and isinstance(json.loads(g_ref.text), dict)
    except ValueError:
        ok = False
    check(ok, "grammar request gives a JSON object")

    # ---- 3. sessions: turn 2 from the cache, still lossless ----------------
    def session_turns(cl):
        sid = cl.session_open(text=STORY)["session_id"]
        t1 = cl.session_generate(sid, max_tokens=30, temperature=0)
        t2 = cl.session_generate(sid, text=" Then", max_tokens=30, temperature=0)
        return t1, t2

    s1, s2 = session_turns(c)
    check(s2.usage.cached_tokens >= 64, "second turn served from the cache (%d cached)"
          % s2.usage.cached_tokens)
    srv.stop()
    st = spec_steps(srv)
    check(st is not None and st[0] > 0 and st[1] > st[0],
          "the server speculated (steps, tokens) = %s" % (st,))

    # ---- 4. restart without the head over the same cache ------------------
    srv = start()
    c = srv.client(timeout=SHORT_HANG_GUARD_S)
    r = c.generate(PROMPTS[0], max_tokens=N, temperature=0)
    check(r.text == expected[PROMPTS[0]], "without the head after a restart: same text")
    check(r.usage.cached_tokens == 0, "pages written with the head are not found without it "
          "(%d cached)" % r.usage.cached_tokens)
    p1, p2 = session_turns(c)
    check(p1.tokens == s1.tokens and p2.tokens == s2.tokens,
          "session turns without the head == with it")
    o = c.generate(OTHER, max_tokens=N, temperature=0)
    check(o.text == expected[OTHER], "a prompt only this server computes")
    srv.stop()
    check(spec_steps(srv) is None, "no head: no speculation reported")

    # ---- 5. restart with the head: its own pages back, the others not -----
    srv = start("--draft", head)
    c = srv.client(timeout=SHORT_HANG_GUARD_S)
    r = c.generate(PROMPTS[1], max_tokens=N, temperature=0)
    check(r.text == expected[PROMPTS[1]], "with the head after restarts: same text")
    check(r.usage.cached_tokens >= 32, "pages written with the head are found again (%d cached)"
          % r.usage.cached_tokens)
    r = c.generate(tokens=split[1], max_tokens=N, temperature=0.8, seed=3)
    check(r.usage.cached_tokens >= 48 and r.tokens == sampled[1].tokens,
          "sampled speculative output from pages read back from disk == computed fresh")
    o = c.generate(OTHER, max_tokens=N, temperature=0)
    check(o.text == expected[OTHER], "prompt computed only without the head: same text")
    check(o.usage.cached_tokens == 0, "pages written without the head are never used with it "
          "(%d cached)" % o.usage.cached_tokens)
    srv.stop()
    st = spec_steps(srv)
    check(st is not None and st[0] > 0, "speculated after the restart")

    # ---- 6. --draft-max-batch 0: a head loaded, never speculating ----------
    srv = start("--draft", head, "--draft-max-batch", "0", "--no-prefix-cache")
    c = srv.client(timeout=SHORT_HANG_GUARD_S)
    r = c.generate(PROMPTS[2], max_tokens=N, temperature=0)
    check(r.text == expected[PROMPTS[2]], "--draft-max-batch 0: same text")
    srv.stop()
    st = spec_steps(srv)
    check(st is not None and st[0] == 0, "--draft-max-batch 0 never speculates")
    # ---- 7. pages run short: requests are paused and resumed by prefix match
    # (a resumed request first decodes one token plainly: the head needs it)
    srv = start("--draft", head, "--kv-mem", "200K", "--max-seqs", "8")
    results, errors = {}, []

    def presser(k):
        try:
            cl = srv.client(timeout=SHORT_HANG_GUARD_S)
            for i in range(2):
                p = PROMPTS[(k + i) % len(PROMPTS)]
                results[(k, i)] = (p, cl.generate(p, max_tokens=2 * N, temperature=0).tokens)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=presser, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c = srv.client(timeout=SHORT_HANG_GUARD_S)
    paused = c.cache_stats().get("paused", 0)
    full = {p: c.generate(p, max_tokens=2 * N, temperature=0, speculative=False).tokens
            for p in PROMPTS}
    check(not errors, "under page pressure: no errors %s" % errors[:1])
    check(paused > 0, "under page pressure: requests were paused (%d)" % paused)
    check(len(results) == 12 and all(v == full[p] for p, v in results.values()),
          "under page pressure: greedy outputs == plain")
    srv.stop()
finally:
    servers.close()

print("failures:", failures)
sys.exit(1 if failures else 0)
