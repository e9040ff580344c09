#!/usr/bin/env python3
"""serve_check.py — `cairn serve --device DEVICE` end to end, and its answers
against a reference device's.

The first GPU machine cairn gets has no package registry, so this script uses
nothing but the Python standard library: it talks to the servers over the
OpenAI-compatible HTTP API (docs/openai.md) with http.client, never through the
msgpack client. What it does, in order:

  1  start `cairn serve --device DEVICE` on free loopback ports with a fresh
     --cache-dir under --out, a tier 0 (--kv-mem) that holds the long prompt
     plus a quarter, and a host tier (--host-mem) that holds every prompt of
     step 3; and a reference server with --device REFERENCE (no cache dir);
  2  a long prompt (a fraction of the model's context, read from the server:
     /tokenize's max_model_len) cold, then again: the time to the first
     content chunk of a streamed completion (TTFT) each time, and the hit's
     usage.prompt_tokens_details.cached_tokens_by_tier must say the prefix
     came from the device tier;
  3  other prompts of the same length until tier 0 has had to evict the long
     one (LRU moves its pages down to host RAM), then the long prompt again:
     TTFT, and its cached tokens must come from the host tier; then SIGTERM
     (the server writes back every page to LMDB), a restart over the same
     cache dir, and the long prompt again: TTFT, cached tokens from disk;
  4  a fresh device server with the default memory: 32 concurrent sessions
     (threads), each a multi-turn chat with one shared system prompt, half
     of them through a session key (an engine session) and half resending
     their history (the automatic prefix cache): total completion tok/s, and
     every request must finish without error, with exactly max_tokens tokens;
  5  every greedy request of steps 2-4 (temperature 0, fixed max_tokens,
     ignore_eos) sent again, body for body, to the reference server: the
     texts must be equal. A mismatch names the request, the first differing
     token (and character) and both sides' top-2 log-probabilities there, so
     a near tie (numerical noise between devices) is told apart from a bug;
  6  one table last (step, figure, ok/FAILED), DIR/serve.json with every
     figure and check, DIR/server-*.log with every server's output.

Exit status: 0 when every check passed, 1 when one failed, 2 on bad usage.
TTFT and throughput are figures, never checks (no timing thresholds); the
checks are about where the cache found a prefix, errors, and equal answers.

Every server is killed when the script ends, however it ends (an exception,
SIGINT/SIGTERM, or the parent dying: PR_SET_PDEATHSIG on Linux), and every wait
is bounded: HTTP calls by --request-timeout, server starts and stops by their
own guards, the whole run by --time-limit (past it the servers are killed, so
whatever waits on them fails at once and the table still prints).

The cache loads are forced (`--tier-loads always`, see `cairn serve --help`):
the default policy may, rightly, recompute a tiny model's prefix instead of
loading it when that is faster, which would make step 3's tier checks depend
on speed.

usage: serve_check.py --cairn BUILD/cairn --model models/stories260K.gguf
                      [--device cuda] [--reference-device cpu] --out DIR [--quick]
"""
import argparse
import ctypes
import http.client
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
STORIES = os.path.join(ROOT, "tests", "data", "text", "stories.txt")
TIERS = ("device", "host", "disk")

START_GUARD_S = 90   # model load and backend start-up (CUDA context, cuBLAS) at most
STOP_GUARD_S = 60    # SIGTERM: drain, write-back of every page, fsync at most

SYSTEM = ("You are a friendly storyteller for small children. You answer in short, simple "
          "sentences. You like stories about animals, parks, balls and gardens, and every story "
          "ends happily.")
NAMES = ["Max", "Sue", "Lily", "Tom", "Ben", "Mia", "Sam", "Anna", "Zoe", "Leo", "Tim", "Kim",
         "Bob", "Amy", "Dan", "Eve"]
THINGS = ["a ball", "the garden", "the birds", "a stick", "the big tree", "the mud", "the fence",
          "a red house", "a little boat", "a cake", "the park", "a kite", "the river", "a cat",
          "the sun", "a box"]
FOLLOW_UPS = ["What happened next?", "And how did the story end?", "Who else came to play?"]


def log(msg):
    print(f"serve_check: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Servers: started, waited for, stopped, and killed whatever happens
# ---------------------------------------------------------------------------
_LIVE = []            # every Popen still possibly running
_LIVE_LOCK = threading.Lock()


try:  # looked up here, in the parent: the child only calls it
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _PRCTL = None


def _die_with_parent():
    """In the child, before exec: SIGKILL when the parent (this script) dies,
    so even a SIGKILLed check leaves no server behind. Linux only; elsewhere
    the signal handlers and the finally clauses are all there is."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def kill_all():
    with _LIVE_LOCK:
        procs = list(_LIVE)
    for p in procs:
        if p.poll() is None:
            try:
                p.kill()
            except OSError:
                pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


class ServerError(RuntimeError):
    pass


class Server:
    """One `cairn serve` with its output in DIR/server-NAME.log."""

    def __init__(self, name, cairn, args, out_dir):
        self.name = name
        self.cmd = [cairn, "serve", "--port", "0", "--http-port", "0", *args]
        self.log_path = os.path.join(out_dir, f"server-{name}.log")
        self.proc = None
        self.port = None
        self.service_line = ""
        self.start_s = None

    def start(self):
        t0 = time.perf_counter()
        with open(self.log_path, "w") as f:
            f.write("$ " + " ".join(self.cmd) + "\n")
            f.flush()
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=f,
                                         stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        with _LIVE_LOCK:
            _LIVE.append(self.proc)
        deadline = time.monotonic() + START_GUARD_S
        while time.monotonic() < deadline:
            text = self.log()
            m = re.search(r"listening on .*?http [^\s,()]*:(\d+)", text)
            if m:
                self.port = int(m.group(1))
                s = re.search(r"^.*service: .*$", text, re.M)
                self.service_line = s.group(0) if s else ""
                self.start_s = time.perf_counter() - t0
                return self
            if self.proc.poll() is not None:
                lines = text.splitlines()
                first = lines[1] if len(lines) > 1 else "(no output)"
                raise ServerError(f"server {self.name} exited with status {self.proc.returncode}"
                                  f" before listening: {first}\n{self.tail()}")
            time.sleep(0.02)
        self.kill()
        raise ServerError(f"server {self.name} was not listening after {START_GUARD_S} s:\n"
                          f"{self.tail()}")

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def tail(self, n=15):
        return "\n".join(self.log().splitlines()[-n:])

    def stop(self):
        """SIGTERM and wait: the exit status, or None when it had to be killed."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=STOP_GUARD_S)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


# ---------------------------------------------------------------------------
# HTTP: JSON calls and streamed completions, each bounded by a timeout
# ---------------------------------------------------------------------------
class HttpError(RuntimeError):
    pass


def _request(port, method, path, body, timeout):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if data is not None else {}
    conn.request(method, path, body=data, headers=headers)
    return conn, conn.getresponse()


def call(port, path, body=None, timeout=60):
    """A JSON request (POST when body is given); the decoded reply."""
    conn, resp = _request(port, "POST" if body is not None else "GET", path, body, timeout)
    try:
        raw = resp.read()
        if resp.status != 200:
            raise HttpError(f"{path}: HTTP {resp.status}: {raw[:300].decode(errors='replace')}")
        return json.loads(raw) if path != "/metrics" else raw.decode()
    finally:
        conn.close()


def metrics(port, timeout=30):
    """/metrics as {'name{labels}': value}."""
    out = {}
    for line in call(port, "/metrics", timeout=timeout).splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                pass
    return out


class Reply:
    """What one generation answered: text, tokens with their top log-probs,
    usage, finish reason; and, when streamed, TTFT (request sent -> first
    chunk with content) and the total time."""

    def __init__(self):
        self.text = ""
        self.tokens = []        # [(token text, logprob, [(alt, logprob), ...])]
        self.usage = {}
        self.finish = None
        self.ttft_s = None
        self.total_s = None

    @property
    def cached(self):
        return self.usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)

    @property
    def by_tier(self):
        return self.usage.get("prompt_tokens_details", {}).get("cached_tokens_by_tier", {})

    def add_logprobs(self, choice, chat):
        lp = choice.get("logprobs")
        if not lp:
            return
        if chat:
            for t in lp.get("content") or []:
                self.tokens.append((t["token"], t["logprob"],
                                    [(a["token"], a["logprob"]) for a in t.get("top_logprobs", [])]))
        else:
            tops = lp.get("top_logprobs") or []
            for i, t in enumerate(lp.get("tokens") or []):
                alts = sorted(tops[i].items(), key=lambda kv: -kv[1]) if i < len(tops) else []
                self.tokens.append((t, lp["token_logprobs"][i], alts))


def generate(port, path, body, stream, timeout):
    """One /v1/completions or /v1/chat/completions request: a Reply."""
    chat = path.endswith("chat/completions")
    body = dict(body, stream=stream)
    if stream:
        body["stream_options"] = {"include_usage": True}
    r = Reply()
    t0 = time.perf_counter()
    conn, resp = _request(port, "POST", path, body, timeout)
    try:
        if resp.status != 200:
            raise HttpError(f"{path}: HTTP {resp.status}: "
                            f"{resp.read()[:300].decode(errors='replace')}")
        if not stream:
            reply = json.loads(resp.read())
            choice = reply["choices"][0]
            r.text = (choice["message"]["content"] or "") if chat else choice["text"]
            r.finish = choice.get("finish_reason")
            r.add_logprobs(choice, chat)
            r.usage = reply.get("usage") or {}
            r.total_s = time.perf_counter() - t0
            return r
        done = False
        for raw in resp:  # SSE: "data: {...}" lines, then "data: [DONE]"
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise HttpError(f"{path}: error in stream: {chunk['error']}")
            if chunk.get("usage"):
                r.usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                if piece:
                    if r.ttft_s is None:
                        r.ttft_s = time.perf_counter() - t0
                    r.text += piece
                r.add_logprobs(choice, chat)
                if choice.get("finish_reason"):
                    r.finish = choice["finish_reason"]
        r.total_s = time.perf_counter() - t0
        if not done:
            raise HttpError(f"{path}: the stream ended without [DONE]")
        if r.ttft_s is None:  # nothing but empty pieces: the first token is the end
            r.ttft_s = r.total_s
        return r
    finally:
        conn.close()


# ---------------------------------------------------------------------------
# The check
# ---------------------------------------------------------------------------
class Check:
    def __init__(self, a):
        self.a = a
        self.rows = []          # (step, figure, ok: True / False / None for a figure)
        self.figures = {}       # everything, for serve.json
        self.device_runs = []   # (label, path, body, Reply) of every greedy device request
        self.failed = False
        self.servers = {}
        self.stopping = None    # why the run ends early (time limit, signal), or None

    # -- bookkeeping -----------------------------------------------------
    def row(self, step, figure, ok=None):
        self.rows.append((step, figure, ok))
        if ok is False:
            self.failed = True
        log(f"[{step}] {figure}" + ("" if ok is None else ("  ok" if ok else "  FAILED")))

    def server(self, name, device, extra):
        a = self.a
        if self.stopping:
            raise ServerError(f"not starting server {name}: {self.stopping}")
        args = ["-m", a.model, "--device", device, "--drain-timeout", "10", *extra,
                *a.server_arg]
        srv = Server(name, a.cairn, args, a.out)
        self.servers[name] = srv
        srv.start()
        self.figures.setdefault("servers", {})[name] = {
            "command": srv.cmd, "service": srv.service_line, "start_s": srv.start_s}
        log(f"server {name}: http port {srv.port}, {srv.service_line.split('service: ')[-1]}")
        return srv

    def gen(self, srv, label, path, body, stream=True, record=True):
        r = generate(srv.port, path, body, stream, self.a.request_timeout)
        if record:
            self.device_runs.append((label, path, body, r))
        return r

    # -- inputs ----------------------------------------------------------
    def documents(self, port, n, length):
        """n token-id prompts of exactly `length` tokens (BOS first), no two
        sharing a first page: tests/data/text/stories.txt rotated by a
        different number of words, behind a different heading each."""
        try:
            with open(STORIES) as f:
                words = f.read().split()
        except OSError:  # a tree without the test data: a plain generated text
            words = [f"{NAMES[i % 16]} saw {THINGS[(i * 7) % 16]}." for i in range(400)]
            words = " ".join(words).split()
        docs = []
        for k in range(n):
            off = (k * 97) % len(words)
            text = f"Book {k + 1}: {NAMES[k % 16]} and {THINGS[k % 16]}. " + " ".join(
                words[off:] + words[:off])
            ids = call(port, "/tokenize", {"content": text}, self.a.request_timeout)["tokens"]
            while len(ids) < length:  # repeat the body (not the BOS) until long enough
                ids = ids + ids[1:]
            docs.append(ids[:length])
        return docs

    # -- step 1 ----------------------------------------------------------
    def start_servers(self):
        a = self.a
        ref = self.server("reference", a.reference_device, [])
        self.ref = ref
        info = call(ref.port, "/tokenize", {"content": "Once upon a time"}, a.request_timeout)
        self.n_ctx = int(info["max_model_len"])
        # one request of a few whole pages, so that the tier-0 gauges say
        # what a page costs (a partial page is not counted there)
        generate(ref.port, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 64,
                                               "temperature": 0, "ignore_eos": True}, False,
                 a.request_timeout)
        m = metrics(ref.port)
        pages = m.get('cairn_kv_pages_used{tier="device"}', 0)
        if not pages:
            raise ServerError("the reference server holds no page after a request "
                              "(cairn_kv_pages_used{tier=\"device\"} is 0)")
        page_bytes = int(m['cairn_kv_bytes_used{tier="device"}'] // pages)
        psize = re.search(r"pages of (\d+) tokens", ref.service_line)
        if not psize:
            raise ServerError(f"no page size in the server's service line: "
                              f"{ref.service_line!r}")
        self.page = int(psize.group(1))
        # whole pages, and room for the answer within the context
        room = self.n_ctx - a.max_tokens - self.page
        self.prompt_len = min(int(self.n_ctx * a.fraction), room) // self.page * self.page
        if self.prompt_len < 4 * self.page:
            raise ServerError(f"a context of {self.n_ctx} leaves no room for a long prompt")
        self.prompt_pages = math.ceil((self.prompt_len + a.max_tokens) / self.page)
        tier0_pages = self.prompt_pages + max(4, self.prompt_pages // 4)
        self.fillers_n = 2
        host_pages = 4 * (self.fillers_n + 2) * self.prompt_pages
        self.dev_args = ["--cache-dir", os.path.join(a.out, "cache"),
                         "--kv-mem", str(tier0_pages * page_bytes),
                         "--host-mem", str(host_pages * page_bytes),
                         "--tier-loads", "always", "--max-seqs", "4"]
        self.figures.update(n_ctx=self.n_ctx, page_size=self.page, page_bytes=page_bytes,
                            prompt_tokens=self.prompt_len, tier0_pages_asked=tier0_pages,
                            host_pages_asked=host_pages)
        self.row(1, f"reference on {a.reference_device}: context {self.n_ctx}, page "
                    f"{self.page} tokens = {page_bytes} B", True)
        dev = self.server("device", a.device, self.dev_args)
        self.tier0_pages = int(metrics(dev.port).get("cairn_kv_device_pages_total", 0))
        self.figures["tier0_pages"] = self.tier0_pages
        # the page geometry is the backend's common one (kernels/backend.c),
        # so tier 0 has the pages asked for; if not, step 3 could not work
        fits = self.prompt_pages + 2 <= self.tier0_pages <= tier0_pages
        self.row(1, f"device server on {a.device}: tier 0 {self.tier0_pages} pages (asked "
                    f"{tier0_pages}, prompt {self.prompt_pages}), host tier {host_pages} pages",
                 fits)
        if not fits:
            raise ServerError(f"tier 0 has {self.tier0_pages} pages, not the {tier0_pages} asked"
                              f" for: the device's KV pages differ in size from the reference's")
        self.dev = dev

    # -- steps 2 and 3 ---------------------------------------------------
    def long_prompt(self, srv, label):
        body = {"prompt": self.target, "max_tokens": self.a.max_tokens, "temperature": 0,
                "ignore_eos": True, "logprobs": 2}
        r = self.gen(srv, label, "/v1/completions", body)
        # "shared" is the Redis tier (docs/scale-out.md): none here, so 0
        tiers = {t: r.by_tier.get(t, 0) for t in TIERS + ("shared",)}
        self.figures.setdefault("long_prompt", {})[label] = {
            "ttft_s": r.ttft_s, "total_s": r.total_s, "prompt_tokens":
            r.usage.get("prompt_tokens"), "cached_tokens": r.cached, "by_tier": tiers}
        return r, tiers

    def check_tier(self, step, label, r, tiers, tier, cold_ttft):
        """A hit must be the prompt's whole pages, all from `tier`: in memory
        the tree holds the KV to the token, from disk only whole pages come
        back, and the prompt's last token is always computed for its logits
        (tests/server/test_persist.py states the same bounds). Beyond the
        whole pages a hit may reuse part of one more page: in memory it is
        counted in the tier it came from, like the rest; after a restart
        (disk) it is a page the tree holds in memory by then, so up to one
        page less one token may come from the device or host RAM there.
        Nothing else may come from another tier."""
        n = r.usage.get("prompt_tokens", 0)
        want = (n - 1) // self.page * self.page
        others = sum(v for t, v in tiers.items() if t != tier)
        ok = tiers[tier] >= want and (others == 0 or (tier == "disk" and others < self.page))
        ratio = f", {cold_ttft / r.ttft_s:.1f}x faster than cold" if r.ttft_s else ""
        self.row(step, f"{label}: TTFT {r.ttft_s * 1e3:.1f} ms{ratio}; cached {r.cached}/{n}: "
                       f"device {tiers['device']}, host {tiers['host']}, disk {tiers['disk']} "
                       f"(want >= {want} from {tier})", ok)

    def tiers_steps(self):
        a, dev = self.a, self.dev
        docs = self.documents(self.ref.port, 1 + self.fillers_n + 1, self.prompt_len)
        self.target, self.fillers = docs[0], docs[1:-1]
        # without BOS: shares no token with any prompt here, so "cold" is cold
        warm = docs[-1][1:2 * self.page]
        # an unrelated short request first: one-time costs of the backend
        # (lazy kernel loading, library handles) stay out of the cold TTFT
        self.gen(dev, "warm-up", "/v1/completions", {"prompt": warm, "max_tokens": 4,
                                                     "temperature": 0}, record=False)
        cold, tiers = self.long_prompt(dev, "cold")
        n = cold.usage.get("prompt_tokens", 0)
        self.row(2, f"cold, {n} tokens ({n / self.n_ctx:.0%} of the context): TTFT "
                    f"{cold.ttft_s * 1e3:.1f} ms, cached {cold.cached}",
                 cold.cached == 0 and n == self.prompt_len)
        hit, tiers = self.long_prompt(dev, "device hit")
        self.check_tier(2, "hit", hit, tiers, "device", cold.ttft_s)

        # push it out of tier 0: each filler is as long as the prompt, and
        # tier 0 holds one prompt and a quarter, so two are enough for LRU
        # to move every page of the long prompt down to host RAM
        before = metrics(dev.port).get("cairn_kv_evicted_pages_total", 0)
        for k, f in enumerate(self.fillers):
            self.gen(dev, f"filler {k + 1}", "/v1/completions",
                     {"prompt": f, "max_tokens": a.max_tokens, "temperature": 0,
                      "ignore_eos": True, "logprobs": 2}, stream=False)
        m = metrics(dev.port)
        evicted = m.get("cairn_kv_evicted_pages_total", 0) - before
        self.figures["evicted_pages"] = evicted
        self.figures["host_pages_used"] = m.get('cairn_kv_pages_used{tier="host"}', 0)
        self.row(3, f"{len(self.fillers)} other prompts: {evicted:.0f} pages evicted from tier 0,"
                    f" host tier holds {self.figures['host_pages_used']:.0f}",
                 evicted >= self.prompt_pages - 1)
        host, tiers = self.long_prompt(dev, "host hit")
        self.check_tier(3, "host RAM hit", host, tiers, "host", cold.ttft_s)

        t0 = time.perf_counter()
        rc = dev.stop()
        stop_s = time.perf_counter() - t0
        self.figures["stop_s"] = stop_s
        self.row(3, f"SIGTERM (write-back to the disk tier): exit {rc} in {stop_s:.2f} s", rc == 0)
        dev2 = self.server("device-restart", a.device, self.dev_args)
        self.gen(dev2, "warm-up", "/v1/completions", {"prompt": warm, "max_tokens": 4,
                                                      "temperature": 0}, record=False)
        disk, tiers = self.long_prompt(dev2, "disk hit")
        self.check_tier(3, f"restart ({dev2.start_s:.2f} s to listening), disk hit", disk,
                        tiers, "disk", cold.ttft_s)
        rc = dev2.stop()
        self.row(3, f"SIGTERM after the disk hit: exit {rc}", rc == 0)
        # wherever the prefix came from, the answer is the cold one (the
        # reference comparison in step 5 says the same across devices)
        phases = [("device hit", hit), ("host hit", host), ("disk hit", disk)]
        differ = [name for name, r in phases if r.text != cold.text]
        self.row(3, "the same answer cold and from every tier" +
                 (f"; differs: {', '.join(differ)}" if differ else ""), not differ)

    # -- step 4 ----------------------------------------------------------
    def concurrent(self):
        a = self.a
        srv = self.server("concurrent", a.device, [])
        self.gen(srv, "warm-up", "/v1/completions", {"prompt": "Once upon a time",
                                                     "max_tokens": 4, "temperature": 0},
                 record=False)
        n, turns = a.sessions, a.turns
        results = [[] for _ in range(n)]   # per session: [(body, Reply)]
        errors = [None] * n
        go = threading.Barrier(n + 1)

        def session(i):
            msgs = [{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f"Tell me a story about {NAMES[i % 16]} and "
                                                f"{THINGS[(i * 5) % 16]} (story {i + 1})."}]
            try:
                go.wait(timeout=a.request_timeout)
                for t in range(turns):
                    body = {"messages": list(msgs), "max_tokens": a.chat_tokens,
                            "temperature": 0, "ignore_eos": True, "logprobs": True,
                            "top_logprobs": 2}
                    if i % 2 == 0:  # half through an engine session, half resending
                        body["session_id"] = f"serve-check-{i}"
                    r = generate(srv.port, "/v1/chat/completions", body, True,
                                 a.request_timeout)
                    results[i].append((body, r))
                    msgs += [{"role": "assistant", "content": r.text},
                             {"role": "user", "content": FOLLOW_UPS[t % len(FOLLOW_UPS)]}]
            except Exception as e:  # noqa: BLE001 - reported per session below
                errors[i] = f"session {i} turn {len(results[i]) + 1}: {e}"

        threads = [threading.Thread(target=session, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        go.wait(timeout=a.request_timeout)
        t0 = time.perf_counter()
        for t in threads:
            t.join(timeout=max(1.0, self.deadline - time.monotonic()))
        wall = time.perf_counter() - t0
        for i, t in enumerate(threads):
            if t.is_alive() and errors[i] is None:
                errors[i] = f"session {i}: still running at the time limit"

        replies = [r for rs in results for _, r in rs]
        completion = sum(r.usage.get("completion_tokens", 0) for r in replies)
        prompt = sum(r.usage.get("prompt_tokens", 0) for r in replies)
        cached = sum(r.cached for r in replies)
        ttfts = sorted(r.ttft_s for r in replies)
        short = [f"session {i} turn {k + 1}: {r.usage.get('completion_tokens')} tokens, "
                 f"finish {r.finish}" for i, rs in enumerate(results)
                 for k, (_, r) in enumerate(rs)
                 if r.usage.get("completion_tokens") != a.chat_tokens or r.finish != "length"]
        later = [r for rs in results for _, r in rs[1:]]
        later_hit = sum(1 for r in later if r.cached > 0)
        errs = [e for e in errors if e] + short
        self.figures["concurrent"] = {
            "sessions": n, "turns": turns, "max_tokens": a.chat_tokens, "wall_s": wall,
            "requests": len(replies), "completion_tokens": completion,
            "prompt_tokens": prompt, "cached_tokens": cached,
            "tok_per_s": completion / wall if wall > 0 else 0,
            "ttft_p50_s": ttfts[len(ttfts) // 2] if ttfts else None,
            "ttft_max_s": ttfts[-1] if ttfts else None,
            "later_turns_with_cache_hit": later_hit, "errors": errs}
        self.row(4, f"{n} sessions x {turns} turns x {a.chat_tokens} tokens: {len(replies)} "
                    f"requests, {completion} tokens in {wall:.2f} s = "
                    f"{completion / wall if wall else 0:.0f} tok/s; TTFT p50 "
                    f"{(ttfts[len(ttfts) // 2] if ttfts else 0) * 1e3:.0f} ms",
                 not errs and len(replies) == n * turns)
        for e in errs[:5]:
            log(f"  {e}")
        # a later turn resends (or continues) a history the server computed:
        # the cache must serve some of it every time
        self.row(4, f"later turns served from the prefix cache: {later_hit}/{len(later)}, "
                    f"cached {cached}/{prompt} prompt tokens in all",
                 later_hit == len(later) and len(later) == n * (turns - 1))
        for i in range(n):
            for k, (body, r) in enumerate(results[i]):
                self.device_runs.append((f"session {i} turn {k + 1}", "/v1/chat/completions",
                                         body, r))
        rc = srv.stop()
        self.row(4, f"SIGTERM: exit {rc}", rc == 0)

    # -- step 5 ----------------------------------------------------------
    def reference(self):
        """Each device request again on the reference, in the same order
        within a session (a session key's turns must come one after the
        other), sessions in parallel."""
        a = self.a
        chains = {}
        for run in self.device_runs:
            key = run[0].split(" turn ")[0] if run[0].startswith("session ") else "tiers"
            chains.setdefault(key, []).append(run)
        refs = {}
        errors = []
        ref_body_cache = {}
        lock = threading.Lock()

        def replay(chain):
            for label, path, body, _ in chain:
                k = json.dumps([path, body], sort_keys=True)
                try:
                    with lock:
                        hit = ref_body_cache.get(k)
                    r = hit or generate(self.ref.port, path, body, False, a.request_timeout)
                    with lock:
                        ref_body_cache[k] = r
                        refs[label] = r
                except Exception as e:  # noqa: BLE001 - reported below
                    with lock:
                        errors.append(f"{label}: {e}")

        t0 = time.perf_counter()
        threads = [threading.Thread(target=replay, args=(c,), daemon=True)
                   for c in chains.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=max(1.0, self.deadline - time.monotonic()))
        wall = time.perf_counter() - t0
        mismatches = []
        for label, path, body, r in self.device_runs:
            ref = refs.get(label)
            if ref is None:
                continue
            if r.text != ref.text:
                mismatches.append(describe_mismatch(label, r, ref))
        compared = len([1 for run in self.device_runs if run[0] in refs])
        self.figures["reference"] = {"device": a.reference_device, "wall_s": wall,
                                     "compared": compared, "mismatches": mismatches,
                                     "errors": errors}
        self.row(5, f"{compared}/{len(self.device_runs)} greedy requests on "
                    f"{a.reference_device} in {wall:.2f} s: {len(mismatches)} differ from "
                    f"{a.device}", not mismatches and not errors and
                 compared == len(self.device_runs))
        for m in mismatches[:8]:
            log("  mismatch " + m["summary"])
        for e in errors[:5]:
            log(f"  {e}")

    # -- the whole run ---------------------------------------------------
    def run(self):
        a = self.a
        self.deadline = time.monotonic() + a.time_limit
        watchdog = threading.Timer(a.time_limit, self.time_up)
        watchdog.daemon = True
        watchdog.start()
        t0 = time.perf_counter()
        try:
            self.dev = None
            steps = [("1", self.start_servers), ("2-3", self.tiers_steps),
                     ("4", self.concurrent), ("5", self.reference)]
            for name, step in steps:
                try:
                    step()
                except Exception as e:  # noqa: BLE001 - the table says which step broke
                    self.row(name, f"stopped: {type(e).__name__}: {e}".splitlines()[0], False)
                    log(str(e))
                    if name == "1":  # no servers: nothing else can run
                        break
                if self.stopping:
                    break
        finally:
            watchdog.cancel()
            for s in self.servers.values():
                s.kill()
            kill_all()
        self.figures["total_s"] = time.perf_counter() - t0
        self.report()
        return 1 if self.failed else 0

    def time_up(self):
        self.stop_early(f"time limit of {self.a.time_limit:g} s reached")

    def stop_early(self, why):
        """Kill the servers, so that whatever waits on one fails at once and
        the run reaches its report."""
        if self.stopping:
            return
        self.stopping = why
        log(f"{why}: killing the servers")
        self.rows.append(("-", why, False))
        self.failed = True
        kill_all()

    def report(self):
        a = self.a
        self.figures.update(device=a.device, reference_device=a.reference_device,
                            quick=a.quick, ok=not self.failed,
                            checks=[{"step": str(s), "figure": f, "ok": ok}
                                    for s, f, ok in self.rows])
        with open(os.path.join(a.out, "serve.json"), "w") as f:
            json.dump(self.figures, f, indent=2, default=str)
        w = max([len(f) for _, f, _ in self.rows] + [6])
        lines = [f"cairn serve --device {a.device} (reference {a.reference_device}), "
                 f"{self.figures['total_s']:.1f} s",
                 f"| step | {'figure':<{w}} | result |", f"|------|{'-' * (w + 2)}|--------|"]
        for s, fig, ok in self.rows:
            res = "" if ok is None else ("ok" if ok else "FAILED")
            lines.append(f"| {str(s):<4} | {fig:<{w}} | {res:<6} |")
        lines.append(f"{'FAILED' if self.failed else 'ok'}; figures in "
                     f"{os.path.join(a.out, 'serve.json')}, server logs in "
                     f"{os.path.join(a.out, 'server-*.log')}")
        print("\n".join(lines), flush=True)


def describe_mismatch(label, dev, ref):
    """Where two greedy outputs part: token index (from the log-probs both
    sides returned), character index, and the top-2 there on each side."""
    ch = next((i for i, (x, y) in enumerate(zip(dev.text, ref.text)) if x != y),
              min(len(dev.text), len(ref.text)))
    tok = next((i for i, (x, y) in enumerate(zip(dev.tokens, ref.tokens)) if x[0] != y[0]),
               min(len(dev.tokens), len(ref.tokens)))

    def at(r):
        if tok >= len(r.tokens):
            return "(ended)"
        t, lp, alts = r.tokens[tok]
        return f"{t!r} {lp:.4f} top2 " + ", ".join(f"{x!r} {y:.4f}" for x, y in alts[:2])

    return {"request": label, "first_token": tok, "first_char": ch,
            "device": at(dev), "reference": at(ref),
            "device_text": dev.text[max(0, ch - 20):ch + 40],
            "reference_text": ref.text[max(0, ch - 20):ch + 40],
            "summary": f"{label}: token {tok} (char {ch}): device {at(dev)} | reference "
                       f"{at(ref)}"}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cairn", required=True, help="the cairn executable")
    p.add_argument("--model", required=True, help="GGUF model (models/stories260K.gguf)")
    p.add_argument("--device", default="cuda", help="the device under test (default cuda)")
    p.add_argument("--reference-device", default="cpu", help="the reference (default cpu)")
    p.add_argument("--out", required=True, help="directory for serve.json, logs and the cache")
    p.add_argument("--quick", action="store_true", help="a smaller run (< 30 s on the bundled "
                   "model): a quarter of the context, 2 turns of 16 tokens")
    p.add_argument("--fraction", type=float, help="long prompt as a fraction of the context "
                   "(default 0.75, --quick 0.25)")
    p.add_argument("--max-tokens", type=int, default=8, help="tokens generated after the long "
                   "prompt (default 8)")
    p.add_argument("--sessions", type=int, default=32, help="concurrent sessions (default 32)")
    p.add_argument("--turns", type=int, help="turns per session (default 3, --quick 2)")
    p.add_argument("--chat-tokens", type=int, help="tokens per turn (default 32, --quick 16)")
    p.add_argument("--request-timeout", type=float, default=60, help="seconds any one HTTP "
                   "call may take (default 60)")
    p.add_argument("--time-limit", type=float, help="seconds for the whole run, after which "
                   "the servers are killed (default 240, --quick 90)")
    p.add_argument("--server-arg", action="append", default=[], help="one more argument for "
                   "every `cairn serve` (repeatable)")
    a = p.parse_args()
    a.fraction = a.fraction or (0.25 if a.quick else 0.75)
    a.turns = a.turns or (2 if a.quick else 3)
    a.chat_tokens = a.chat_tokens or (16 if a.quick else 32)
    a.time_limit = a.time_limit or (90 if a.quick else 240)
    if not (0 < a.fraction < 1) or a.turns < 2 or a.sessions < 1 or a.chat_tokens < 1:
        p.error("--fraction must be in (0, 1), --turns at least 2, --sessions and "
                "--chat-tokens at least 1")
    for path, what in ((a.cairn, "--cairn"), (a.model, "--model")):
        if not os.path.isfile(path):
            p.error(f"{what} {path}: no such file")
    a.cairn, a.model = os.path.abspath(a.cairn), os.path.abspath(a.model)
    os.makedirs(a.out, exist_ok=True)
    shutil.rmtree(os.path.join(a.out, "cache"), ignore_errors=True)  # a fresh disk tier
    for old in os.listdir(a.out):
        if old.startswith("server-") and old.endswith(".log"):
            os.remove(os.path.join(a.out, old))

    check = Check(a)

    def on_signal(signum, _frame):
        if check.stopping:  # a second signal: stop at once
            kill_all()
            raise SystemExit(128 + signum)
        check.stop_early(f"stopped by {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        return check.run()
    finally:
        kill_all()


if __name__ == "__main__":
    sys.exit(main())
