#!/usr/bin/env python3
"""Session-aware eviction under a flood (issue 36): what the sessions of an
agent deployment recompute when one-off requests flood the cache, with
cairn's eviction order (one-off pages first, then reused prefixes, then open
sessions' history: radix/radix.h, "Eviction order") against plain LRU
(`cairn serve --eviction lru`, the order before it) and against llama-server
on the same stream.

Workload (greedy, token ids over the native protocol, so every count is
exact; the same ids to llama-server's /completion):
  sessions  S agent sessions (8) x T turns (6) over one shared system prompt
            with a tool list (~2k tokens). Each turn appends a user message
            (a tool result, ~40 tokens) and generates a short reply; between
            turns the session "runs its tool" for --think seconds. cairn:
            session.open + session.generate (live sessions); llama-server:
            the whole history resent with cache_prompt.
  flood     F clients sending one-off prompts (~600 tokens, distinct from
            their first page, 1 token generated) back to back for as long as
            the sessions run: many times the device tier (--kv-mem).

The system prompt is computed once before the clock starts (a deployment's
steady state). Reported for the session turns: computed prompt tokens
(prompt - cached; llama-server: timings.prompt_n) against their floor (each
turn computes only what no earlier request left KV for: its new tokens), and
TTFT p50 / p99 at the client; and how many flood
requests and tokens went through meanwhile. Goal of the issue: computed
within 1.1x of the floor, and TTFT p99 at most half of LRU's.

The configurations run one after another on a fresh server each; run it on
a quiet machine (ratios between rows are what it measures). This is a
measurement script, not a test.

usage: bench/serve/bench_eviction.py [--bin build/cairn]
         [--model models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf]
         [--llama-server PATH/llama-server] [--kv-mem 80M] [--json out.json]
"""
import argparse
import json
import os
import sys
import threading
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cairn_client.launch import ServerProcess  # noqa: E402
from bench_serve import percentile  # noqa: E402
from bench_share import LlamaServerTarget, free_port, lcp  # noqa: E402

TOOLS = ["read_file", "write_file", "list_dir", "grep", "run_tests", "git_diff", "git_commit",
         "open_issue", "search_docs", "http_get", "sql_query", "send_mail", "calendar",
         "translate", "summarize", "compile", "lint", "format_code", "deploy", "rollback"]


def system_prompt(n_tools):
    """An agent's system prompt: rules and a JSON tool list (~100 tokens a tool)."""
    out = ["You are a coding agent working in a large repository. Think step by step, call "
           "one tool at a time, and answer with a JSON object {\"tool\": NAME, \"args\": "
           "{...}} or {\"final\": TEXT}. Never invent file names; read before you write.\n"
           "Tools:\n"]
    for i in range(n_tools):
        name = TOOLS[i % len(TOOLS)] + ("" if i < len(TOOLS) else "_%d" % i)
        out.append(json.dumps({
            "name": name,
            "description": "Use %s to %s. It returns a JSON object with fields status, "
                           "output and elapsed_ms; on error, status is \"error\" and output "
                           "says why." % (name, ["inspect", "change", "check", "publish"][i % 4]
                                          + " the workspace"),
            "parameters": {"type": "object", "properties": {
                "path": {"type": "string", "description": "a path relative to the root"},
                "pattern": {"type": "string", "description": "what to look for"},
                "limit": {"type": "integer", "description": "at most this many results"}},
                "required": ["path"]}}) + "\n")
    return "".join(out)


def tool_result(s, t):
    return ("\nTool result (session %d, step %d): {\"status\": \"ok\", \"output\": \"%d files "
            "matched in src/module_%d; the first is src/module_%d/file_%d.c\", "
            "\"elapsed_ms\": %d}\nAgent:" % (s, t, 3 + s + t, s, s, t, 40 + 7 * s + t))


def flood_text(i):
    """A one-off prompt: a log excerpt whose first page names request i."""
    lines = ["Request %d: summarize this log in one line.\n" % i]
    for k in range(14):
        lines.append("2026-12-06T04:%02d:%02d worker-%d handled job %d of queue %d in %d ms, "
                     "retries %d, status %s\n" % ((i + k) % 60, (7 * k + i) % 60, k % 5,
                                                 1000 * i + k, (i * 3 + k) % 11, 10 + (i * k) % 90,
                                                 k % 3, ["ok", "slow", "ok", "retried"][k % 4]))
    return "".join(lines)


class CairnSessions:
    """Live sessions over the native protocol: session.open with the system
    prompt, session.generate per turn."""

    def __init__(self, srv):
        self.srv = srv

    def conversation(self, system):
        c = self.srv.client()
        sid = c.session_open(tokens=system)["session_id"]

        def turn(tokens, max_tokens):
            t0 = time.perf_counter()
            stream = c.session_generate(sid, tokens=tokens, max_tokens=max_tokens,
                                        temperature=0, stream=True)
            first = None
            for _ in stream:
                if first is None:
                    first = time.perf_counter() - t0
            r = stream.result
            return (first if first is not None else time.perf_counter() - t0,
                    r.usage.prompt_tokens - r.usage.cached_tokens, list(r.tokens))

        def close():
            c.session_close(sid)
            c.close()
        return turn, close

    def one_off(self):
        c = self.srv.client()

        def gen(tokens):
            r = c.generate(tokens=tokens, max_tokens=1, temperature=0)
            return r.usage.prompt_tokens - r.usage.cached_tokens
        return gen, c.close


class LlamaSessions:
    """The same stream to llama-server: the history resent whole each turn."""

    def __init__(self, url):
        self.t = LlamaServerTarget(url)

    def conversation(self, system):
        _, gen = self.t.session()
        history = list(system)

        def turn(tokens, max_tokens):
            nonlocal history
            prompt = history + tokens
            ttft, computed, reply, _cut = gen(prompt, max_tokens)
            history = prompt + reply
            return ttft, computed, reply
        return turn, lambda: None

    def one_off(self):
        _, gen = self.t.session()
        return (lambda tokens: gen(tokens, 1)[1]), (lambda: None)


def run_stream(target, args, work):
    system, msgs, floods = work
    lock = threading.Lock()
    sent = []       # per session turn, in order of sending: [prompt, kv after it]
    ttft, computed, per_turn = [], [], []
    done = threading.Event()
    flood_stats = {"requests": 0, "tokens": 0, "computed": 0}

    def session(i):
        time.sleep(i * args.stagger)
        turn, close = target.conversation(system)
        history = list(system)
        for t in range(args.turns):
            prompt = history + msgs[i][t]
            with lock:
                k = len(sent)
                sent.append(None)
            first, comp, reply = turn(msgs[i][t], args.max_tokens)
            # the reply's last token was sampled, never fed back: no KV
            with lock:
                ttft.append(first)
                computed.append(comp)
                sent[k] = (prompt, prompt + reply[:-1])
                per_turn.append((k, i, t, comp, len(prompt)))
            history = prompt + reply
            time.sleep(args.think)
        close()

    def flood(f):
        gen, close = target.one_off()
        i = f
        while not done.is_set():
            toks = floods[i % len(floods)]
            comp = gen(toks)
            with lock:
                flood_stats["requests"] += 1
                flood_stats["tokens"] += len(toks)
                flood_stats["computed"] += comp
            i += args.flood_clients
        close()

    # The shared system prompt is computed once before the clock starts (a
    # deployment's steady state; otherwise the first turn's cold prefill,
    # the same everywhere, is the p99): one request over it, counted in the
    # floor like any earlier request.
    gen, close = target.one_off()
    gen(system)
    close()
    sent.append((list(system), list(system)))
    t0 = time.perf_counter()
    fl = [threading.Thread(target=flood, args=(f,)) for f in range(args.flood_clients)]
    ss = [threading.Thread(target=session, args=(i,)) for i in range(args.sessions)]
    for t in fl + ss:
        t.start()
    for t in ss:
        t.join()
    done.set()
    for t in fl:
        t.join()
    wall = time.perf_counter() - t0
    floor, floors = 0, {}
    for k, (prompt, _) in enumerate(sent):
        if k == 0:
            continue  # the system prompt, computed before the clock started
        best = max([lcp(prompt, kv) for _, kv in sent[:k]] + [0])
        floors[k] = len(prompt) - min(best, len(prompt) - 1)
        floor += floors[k]
    turns = [{"session": i, "turn": t, "prompt": n, "computed": comp, "floor": floors[k]}
             for k, i, t, comp, n in per_turn]
    return {"turns": len(ttft), "computed": sum(computed), "floor": floor, "ttft": ttft,
            "flood": flood_stats, "wall_s": wall, "per_turn": turns}


def make_work(srv, args):
    with srv.client() as c:
        system = c.tokenize(system_prompt(args.tools), add_bos=False)
        msgs = [[c.tokenize(tool_result(s, t), add_bos=False) for t in range(args.turns)]
                for s in range(args.sessions)]
        floods = [c.tokenize(flood_text(i), add_bos=False) for i in range(args.flood_prompts)]
    return system, msgs, floods


def run_cairn(args, label, order, work):
    srv = ServerProcess(args.bin, ["-m", args.model, "--kv-mem", args.kv_mem, "--eviction", order,
                                   *args.server_args], tcp=True)
    try:
        with srv.client() as c:  # start-up out of the TTFTs, leaving no reusable KV
            c.generate(tokens=c.tokenize("Warm up.", add_bos=False), max_tokens=2, temperature=0)
        res = run_stream(CairnSessions(srv), args, work)
        with srv.client() as c:
            res["cache"] = c.cache_stats()
    finally:
        srv.stop()
    return label, res


def run_llama(args, work):
    import subprocess
    import urllib.request
    port = free_port()
    proc = subprocess.Popen([args.llama_server, "-m", args.model, "--host", "127.0.0.1",
                             "--port", str(port), "-np", str(args.llama_slots),
                             "-c", str(args.llama_ctx * args.llama_slots), "-t", str(args.threads)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = "http://127.0.0.1:%d" % port
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        res = run_stream(LlamaSessions(url), args, work)
    finally:
        proc.terminate()
        proc.wait()
    return "llama-server (%d slots x %d)" % (args.llama_slots, args.llama_ctx), res


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
            else:
                name = "unknown CPU"
        with open("/proc/cpuinfo") as f:
            flags = next((ln for ln in f if ln.startswith("flags")), "")
        isa = "AVX-512" if " avx512f" in flags else "AVX2" if " avx2" in flags else "no AVX2"
        return "%s, %s, %d cores" % (name, isa, os.cpu_count() or 0)
    except OSError:
        return "unknown CPU"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "cairn"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models",
                                                    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
    ap.add_argument("--orders", default="lru,sessions")
    ap.add_argument("--kv-mem", default="80M", help="cairn's device tier (the flood exceeds it)")
    ap.add_argument("--tools", type=int, default=20, help="tools in the system prompt")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--think", type=float, default=3.0, help="seconds between a session's turns")
    ap.add_argument("--stagger", type=float, default=0.5, help="seconds between session starts")
    ap.add_argument("--flood-clients", type=int, default=2)
    ap.add_argument("--flood-prompts", type=int, default=400)
    ap.add_argument("--server-arg", dest="server_args", action="append", default=[])
    ap.add_argument("--llama-server", help="a llama-server binary (the peer)")
    ap.add_argument("--llama-slots", type=int, default=4)
    ap.add_argument("--llama-ctx", type=int, default=4096, help="llama-server context per slot")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--json")
    args = ap.parse_args()
    srv = ServerProcess(args.bin, ["-m", args.model], tcp=True)
    try:
        work = make_work(srv, args)
    finally:
        srv.stop()
    runs = []
    for order in [o for o in args.orders.split(",") if o]:
        label = "cairn --eviction %s" % order
        print("running %s ..." % label, file=sys.stderr)
        runs.append(run_cairn(args, label, order, work))
    if args.llama_server:
        print("running llama-server ...", file=sys.stderr)
        runs.append(run_llama(args, work))
    print("\n%s; model %s; %d sessions x %d turns over a %d-token system prompt, %d tokens a "
          "reply, %.1f s between turns; %d flood client(s) of ~%d-token one-off prompts; cairn "
          "--kv-mem %s (no host tier)\n" % (cpu_name(), os.path.basename(args.model), args.sessions,
                                           args.turns, len(work[0]), args.max_tokens, args.think,
                                           args.flood_clients, len(work[2][0]), args.kv_mem))
    lru = next((r for label, r in runs if label.endswith("lru")), None)
    cols = ["server", "turns", "computed", "floor", "computed/floor", "TTFT p50 ms",
            "TTFT p99 ms", "p99 / LRU p99", "flood reqs", "flood tokens", "wall s"]
    rows = []
    for label, r in runs:
        p99 = percentile(r["ttft"], 99)
        rows.append([label, str(r["turns"]), str(r["computed"]), str(r["floor"]),
                     "%.2fx" % (r["computed"] / max(1, r["floor"])),
                     "%.0f" % (1000 * percentile(r["ttft"], 50)), "%.0f" % (1000 * p99),
                     "%.2fx" % (p99 / percentile(lru["ttft"], 99)) if lru else "-",
                     str(r["flood"]["requests"]), str(r["flood"]["tokens"]),
                     "%.0f" % r["wall_s"]])
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    print("| " + " | ".join(c.ljust(w) for c, w in zip(cols, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(v.ljust(wd) for v, wd in zip(r, widths)) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": dict(runs)}, f, indent=2, default=str)


if __name__ == "__main__":
    main()
