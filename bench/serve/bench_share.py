#!/usr/bin/env python3
"""Prefix sharing benchmark: how many prompt tokens cairn computes, against
the floor (every distinct prefix computed once), for the two patterns where
a cache that only knows finished requests and whole pages falls short.

Workloads (greedy, streamed, over the native protocol with explicit token
ids, so every count is exact):
  burst  N questions about one cold document sent at the same moment (RAG
         fan-out, parallel tool calls, n > 1). Floor: the document once plus
         each question's own tokens.
  chat   S conversations x T turns resent whole every turn, as a stateless
         client does (the full token history, no session): turn t's prompt
         is turn t-1's prompt + its reply + the new user message. Floor:
         every request computes only what no request sent before it left KV
         for (the shared system prompt once, then each turn's new tokens;
         a reply's last token when max_tokens cut it was never fed back).

For each binary (--bin, and --bin-base for the build to compare with, e.g.
main before a change) and for the peer (--llama-server, with --llama-slots
slots, over its /completion endpoint with the same token ids) it starts a
fresh server per workload and prints computed tokens (prompt - cached; for
llama-server timings.prompt_n), their ratio to the floor, and TTFT p50/p99
at the client. A measurement script, not a test.

usage: bench/serve/bench_share.py [--bin build/cairn] [--bin-base OLD/cairn]
                                  [--llama-server PATH/llama-server]
                                  [--model models/stories260K.gguf] [--json out.json]
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cairn_client.launch import ServerProcess  # noqa: E402
from bench_serve import build_document, percentile  # noqa: E402

SYSTEM = ("You are a friendly storyteller for small children. You answer in short, simple "
          "sentences, and every story ends happily.")
NAMES = ["Max", "Sue", "Lily", "Tom", "Ben", "Mia", "Sam", "Anna"]


def lcp(a, b):
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


class CairnTarget:
    """Generations over the native protocol: (ttft s, computed prompt
    tokens, generated tokens, cut by max_tokens)."""

    def __init__(self, srv):
        self.srv = srv

    def session(self):
        c = self.srv.client()

        def gen(tokens, max_tokens):
            t0 = time.perf_counter()
            stream = c.generate(tokens=tokens, max_tokens=max_tokens, temperature=0, stream=True)
            first = None
            for _ in stream:
                if first is None:
                    first = time.perf_counter() - t0
            r = stream.result
            ttft = first if first is not None else time.perf_counter() - t0
            return (ttft, r.usage.prompt_tokens - r.usage.cached_tokens, list(r.tokens),
                    r.finish_reason == "length")
        return c, gen


class LlamaServerTarget:
    """The same over llama-server's /completion (token ids in, streamed,
    cache_prompt on: its slots reuse their own KV for a common prefix);
    computed = timings.prompt_n."""

    def __init__(self, url):
        self.url = url

    def session(self):
        def gen(tokens, max_tokens):
            body = json.dumps({"prompt": tokens, "n_predict": max_tokens, "temperature": 0,
                               "top_k": 1, "stream": True, "cache_prompt": True,
                               "return_tokens": True}).encode()
            req = urllib.request.Request(self.url + "/completion", body,
                                         {"Content-Type": "application/json"})
            t0 = time.perf_counter()
            first, out, last = None, [], {}
            with urllib.request.urlopen(req, timeout=3600) as r:
                for line in r:
                    line = line.strip()
                    if not line.startswith(b"data: "):
                        continue
                    ev = json.loads(line[6:])
                    if first is None:
                        first = time.perf_counter() - t0
                    out += ev.get("tokens", [])
                    last = ev
            computed = last.get("timings", {}).get("prompt_n", len(tokens))
            return first or 0.0, computed, out, last.get("stop_type") == "limit"
        return None, gen


def run_burst(target, args, prompts):
    sessions = [target.session() for _ in prompts]
    out = [None] * len(prompts)
    go = threading.Barrier(len(prompts))

    def one(i):
        go.wait()
        out[i] = sessions[i][1](prompts[i], args.max_tokens)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c, _ in sessions:
        if c:
            c.close()
    shared = max(lcp(prompts[0], p) for p in prompts[1:]) if len(prompts) > 1 else 0
    floor = shared + sum(len(p) - min(shared, len(p) - 1) for p in prompts)
    return {"requests": len(out), "computed": sum(o[1] for o in out), "floor": floor,
            "ttft": [o[0] for o in out]}


def run_chat(target, args, system, msgs):
    lock = threading.Lock()
    stats = {"computed": 0, "ttft": []}
    sent = []  # per request: (prompt, tokens with KV after it)

    def conversation(i):
        history = list(system)
        c, gen = target.session()
        for t in range(args.turns):
            prompt = history + msgs[i][t]
            with lock:
                order = len(sent)
                sent.append(None)
            ttft, computed, reply, cut = gen(prompt, args.max_tokens)
            # KV exists for the prompt and the reply but its last token when
            # max_tokens cut it (sampled, never fed back); a reply that ended
            # with end-of-generation had its last token computed (the end
            # token is not in the history)
            kv = prompt + reply
            if cut:
                kv = kv[:-1]
            with lock:
                stats["computed"] += computed
                stats["ttft"].append(ttft)
                sent[order] = (prompt, kv)
            history = prompt + reply
        if c:
            c.close()

    threads = [threading.Thread(target=conversation, args=(i,)) for i in range(args.sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # the floor: each request computes what no earlier one has KV for (at
    # least its last token, for its logits)
    floor = 0
    for k, (prompt, _) in enumerate(sent):
        best = max([lcp(prompt, kv) for _, kv in sent[:k]] + [0])
        floor += len(prompt) - min(best, len(prompt) - 1)
    stats["floor"] = floor
    stats["requests"] = len(stats["ttft"])
    return stats


def workload_tokens(srv, args, source_text):
    """The token ids of both workloads, from cairn's tokenizer (the same
    GGUF vocabulary llama-server loads)."""
    with srv.client() as c:
        doc, _ = build_document(c, source_text, args.doc_tokens)
        base = c.tokenize(doc, add_bos=True)
        burst = [base + c.tokenize(f"\nQuestion {i + 1}: What did {NAMES[i % 8]} do?\nAnswer:",
                                   add_bos=False) for i in range(args.burst)]
        system = c.tokenize(SYSTEM, add_bos=True)
        msgs = [[c.tokenize(f"\nUser: Tell me about {NAMES[(i + t) % 8]} on day {t + 1}.\n"
                            f"Storyteller:", add_bos=False) for t in range(args.turns)]
                for i in range(args.sessions)]
    return burst, system, msgs


def run_binary(args, label, binary, work):
    res = {}
    for w in args.workloads:
        srv = ServerProcess(binary, ["-m", args.model, *args.server_args], tcp=True)
        try:
            with srv.client() as c:  # start-up costs out of the TTFTs; no BOS:
                # it must leave no KV the workloads could reuse
                c.generate(tokens=c.tokenize("Warm up.", add_bos=False), max_tokens=2,
                           temperature=0)
            target = CairnTarget(srv)
            res[w] = (run_burst(target, args, work[0]) if w == "burst"
                      else run_chat(target, args, work[1], work[2]))
        finally:
            srv.stop()
    return label, res


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_llama_server(args, work):
    """llama-server with --llama-slots slots, a fresh process per workload."""
    res = {}
    for w in args.workloads:
        port = free_port()
        per_slot = 4096
        proc = subprocess.Popen([args.llama_server, "-m", args.model, "--host", "127.0.0.1",
                                 "--port", str(port), "-np", str(args.llama_slots),
                                 "-c", str(per_slot * args.llama_slots), "-t", str(args.threads)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(600):
                try:
                    with urllib.request.urlopen(url + "/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    time.sleep(0.5)
            target = LlamaServerTarget(url)
            res[w] = (run_burst(target, args, work[0]) if w == "burst"
                      else run_chat(target, args, work[1], work[2]))
        finally:
            proc.terminate()
            proc.wait()
    return f"llama-server ({args.llama_slots} slots)", res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "cairn"))
    ap.add_argument("--bin-base", help="a build to compare with (e.g. main before a change)")
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "stories260K.gguf"))
    ap.add_argument("--text", default=os.path.join(ROOT, "tests", "data", "text", "stories.txt"))
    ap.add_argument("--workloads", default="burst,chat")
    ap.add_argument("--doc-tokens", type=int, default=1200)
    ap.add_argument("--burst", type=int, default=8, help="requests sent at once")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--server-arg", dest="server_args", action="append", default=[])
    ap.add_argument("--llama-server", help="a llama-server binary to compare with (the peer)")
    ap.add_argument("--llama-slots", type=int, default=4)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2,
                    help="llama-server's -t (cairn uses all cores by default)")
    ap.add_argument("--json")
    args = ap.parse_args()
    args.workloads = [w for w in args.workloads.split(",") if w]
    with open(args.text) as f:
        source_text = f.read()
    srv = ServerProcess(args.bin, ["-m", args.model], tcp=True)
    try:
        work = workload_tokens(srv, args, source_text)
    finally:
        srv.stop()
    runs = []
    for label, binary in (("cairn", args.bin), ("base", args.bin_base)):
        if binary:
            print(f"running {label}: {binary} ...", file=sys.stderr)
            runs.append(run_binary(args, label, binary, work))
    if args.llama_server:
        print(f"running llama-server: {args.llama_server} ...", file=sys.stderr)
        runs.append(run_llama_server(args, work))
    print(f"\nmodel {os.path.basename(args.model)}; burst: {args.burst} questions at once over "
          f"a {args.doc_tokens}-token document; chat: {args.sessions} conversations x "
          f"{args.turns} turns resent whole; {args.max_tokens} tokens per answer\n")
    cols = ["workload", "build", "reqs", "computed", "floor", "computed/floor",
            "TTFT p50 ms", "TTFT p99 ms"]
    rows = []
    for w in args.workloads:
        for label, res in runs:
            s = res[w]
            rows.append([w, label, str(s["requests"]), str(s["computed"]), str(s["floor"]),
                         f"{s['computed'] / max(1, s['floor']):.2f}x",
                         f"{1000 * percentile(s['ttft'], 50):.1f}",
                         f"{1000 * percentile(s['ttft'], 99):.1f}"])
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    print("| " + " | ".join(c.ljust(w) for c, w in zip(cols, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(v.ljust(wd) for v, wd in zip(r, widths)) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": dict(runs)}, f, indent=2)


if __name__ == "__main__":
    main()
