#!/usr/bin/env python3
"""Serving benchmark: RAG and multi-turn chat against `cairn serve`, with
prefix caching on and off in the same run.

Workloads (all greedy, streamed, so time-to-first-token is measured at the
client):
  rag   one long document (~1.6k tokens by default) x N questions; each request
        is document + question. With caching on, every request after the
        first finds the document's pages.
  chat  S sessions x T turns over a shared system prompt; each turn sends one
        user message with session.generate, so turn t's prompt is the whole
        conversation so far.

For each mode (cache on, cache off = `cairn serve --no-prefix-cache`) it
starts a fresh server, runs both workloads, and reports TTFT p50/p99,
generated tokens/s, and the fraction of prompt tokens served from the cache,
then the off/on ratios. This is a measurement script, not a test.

The bundled model (models/stories260K.gguf) has a 2048-token context, so the
default document is ~1600 tokens: the document, a question and the answer
must fit in one context.

usage: bench/serve/bench_serve.py [--bin build/cairn] [--model models/stories260K.gguf]
                                  [--modes on,off] [--json out.json] [...]
"""
import argparse
import json
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
from cairn_client.launch import ServerProcess, ServerStartError  # noqa: E402

NAMES = ["Max", "Sue", "Lily", "Tom", "Ben", "Mia", "Sam", "Anna"]
THINGS = ["the ball", "the garden", "the birds", "the stick", "the tree", "the mud", "the fence",
          "the house"]


def percentile(xs, q):
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(round(q / 100.0 * len(s) + 0.5)) - 1))
    return s[k]


class Recorder:
    """Per-request measurements of one workload run."""

    def __init__(self):
        self.lock = threading.Lock()
        self.ttft = []
        self.prompt_tokens = self.cached_tokens = self.completion_tokens = 0
        self.requests = 0

    def timed_stream(self, start_stream):
        """Run one streamed generation; record TTFT and usage."""
        t0 = time.perf_counter()
        stream = start_stream()
        first = None
        for item in stream:
            if first is None:
                first = time.perf_counter() - t0
        r = stream.result
        with self.lock:
            self.requests += 1
            self.ttft.append(first if first is not None else time.perf_counter() - t0)
            self.prompt_tokens += r.usage.prompt_tokens
            self.cached_tokens += r.usage.cached_tokens
            self.completion_tokens += r.usage.completion_tokens
        return r

    def summary(self, wall_s):
        return {
            "requests": self.requests,
            "ttft_p50_ms": 1000 * percentile(self.ttft, 50),
            "ttft_p99_ms": 1000 * percentile(self.ttft, 99),
            "ttft_mean_ms": 1000 * statistics.mean(self.ttft),
            "gen_tok_s": self.completion_tokens / wall_s,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "cached_fraction": self.cached_tokens / max(1, self.prompt_tokens),
            "completion_tokens": self.completion_tokens,
            "wall_s": wall_s,
        }


def build_document(client, source_text, target_tokens):
    """The longest whole-word prefix of source_text (repeated as needed)
    whose tokenization (with BOS) is at most target_tokens."""
    words = source_text.split()
    while len(words) < target_tokens:  # a token is at most a word or so
        words = words + words
    lo, hi = 1, len(words)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(client.tokenize(" ".join(words[:mid]))) <= target_tokens:
            lo = mid
        else:
            hi = mid - 1
    doc = " ".join(words[:lo])
    return doc, len(client.tokenize(doc))


def run_rag(srv, args, doc):
    questions = [f"\nQuestion {i + 1}: What did {NAMES[i % 8]} do with {THINGS[(i * 3) % 8]}?"
                 f"\nAnswer:" for i in range(args.questions)]
    rec = Recorder()
    clients = [srv.client() for _ in range(args.concurrency)]

    def one(i):
        c = clients[i % len(clients)]
        rec.timed_stream(lambda: c.generate(prompt=doc + questions[i], max_tokens=args.max_tokens,
                                            temperature=0, stream=True))

    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        list(pool.map(one, range(len(questions))))
    wall = time.perf_counter() - t0
    for c in clients:
        c.close()
    return rec.summary(wall)


SYSTEM = ("You are a friendly storyteller for small children. You answer in short, simple "
          "sentences. You like stories about animals, parks, balls and gardens, and every story "
          "ends happily. When a child asks a question, you answer it kindly and then ask a "
          "small question back.")


def run_chat(srv, args):
    rec = Recorder()

    def session(i):
        with srv.client() as c:
            sid = c.session_open(system=SYSTEM)["session_id"]
            for t in range(args.turns):
                msg = {"role": "user",
                       "content": f"Tell me what {NAMES[(i + t) % 8]} did with "
                                  f"{THINGS[(i * 5 + t) % 8]} on day {t + 1}."}
                rec.timed_stream(lambda: c.session_generate(sid, messages=[msg],
                                                            max_tokens=args.max_tokens,
                                                            temperature=0, stream=True))
            c.session_close(sid)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.sessions) as pool:
        list(pool.map(session, range(args.sessions)))
    return rec.summary(time.perf_counter() - t0)


def run_mode(args, mode, source_text):
    extra = ["--no-prefix-cache"] if mode == "off" else []
    try:
        srv = ServerProcess(args.bin, ["-m", args.model, *args.server_args, *extra], tcp=True)
    except ServerStartError as e:
        if extra and ("no-prefix-cache" in str(e) or "unrecognized" in str(e)
                      or "unknown" in str(e)):
            print(f"\n*** `cairn serve --no-prefix-cache` was rejected: this build cannot turn "
                  f"prefix caching off, so the 'off' rows are skipped. Server said:\n{e}\n",
                  file=sys.stderr)
            return None
        raise
    try:
        with srv.client() as c:
            info = c.info()
            doc, doc_tokens = build_document(c, source_text, args.doc_tokens)
            # one unrelated request so start-up costs do not land in a TTFT
            c.generate(prompt="Warm up.", max_tokens=4, temperature=0)
        out = {"mode": mode, "page_size": info["page_size"], "n_ctx": info["model"]["n_ctx"],
               "doc_tokens": doc_tokens}
        if "rag" in args.workloads:
            out["rag"] = run_rag(srv, args, doc)
        if "chat" in args.workloads:
            out["chat"] = run_chat(srv, args)
        with srv.client() as c:
            out["cache_stats"] = c.cache_stats()
        return out
    finally:
        srv.stop()


def print_table(results, args):
    cols = ["workload", "cache", "reqs", "TTFT p50 ms", "TTFT p99 ms", "gen tok/s",
            "cached frac", "wall s"]
    rows = []
    for res in results:
        for w in args.workloads:
            s = res[w]
            rows.append([w, res["mode"], str(s["requests"]), f"{s['ttft_p50_ms']:.1f}",
                         f"{s['ttft_p99_ms']:.1f}", f"{s['gen_tok_s']:.0f}",
                         f"{s['cached_fraction']:.3f}", f"{s['wall_s']:.2f}"])
    by_mode = {r["mode"]: r for r in results}
    if "on" in by_mode and "off" in by_mode:
        for w in args.workloads:
            on, off = by_mode["on"][w], by_mode["off"][w]
            rows.append([w, "off/on", "",
                         f"{off['ttft_p50_ms'] / max(on['ttft_p50_ms'], 1e-9):.2f}x",
                         f"{off['ttft_p99_ms'] / max(on['ttft_p99_ms'], 1e-9):.2f}x",
                         f"{on['gen_tok_s'] / max(off['gen_tok_s'], 1e-9):.2f}x (on/off)", "",
                         f"{off['wall_s'] / max(on['wall_s'], 1e-9):.2f}x"])
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    line = "| " + " | ".join(c.ljust(w) for c, w in zip(cols, widths)) + " |"
    print(line)
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(v.ljust(w) for v, w in zip(r, widths)) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "cairn"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "stories260K.gguf"))
    ap.add_argument("--text", default=os.path.join(ROOT, "tests", "data", "text", "stories.txt"),
                    help="source of the RAG document")
    ap.add_argument("--modes", default="on,off", help="on, off or on,off")
    ap.add_argument("--workloads", default="rag,chat")
    ap.add_argument("--doc-tokens", type=int, default=1600)
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=4, help="RAG requests in flight")
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--server-arg", dest="server_args", action="append", default=[],
                    help="extra argument for `cairn serve` (repeatable)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    args.workloads = [w for w in args.workloads.split(",") if w]
    with open(args.text) as f:
        source_text = f.read()

    results = []
    for mode in [m for m in args.modes.split(",") if m]:
        print(f"running: prefix cache {mode} ...", file=sys.stderr)
        r = run_mode(args, mode, source_text)
        if r is not None:
            results.append(r)
    if not results:
        sys.exit("no mode ran")
    r0 = results[0]
    print(f"\nmodel {os.path.basename(args.model)}, n_ctx {r0['n_ctx']}, page {r0['page_size']}; "
          f"rag: {args.questions} questions over a {r0['doc_tokens']}-token document, "
          f"{args.concurrency} in flight; chat: {args.sessions} sessions x {args.turns} turns; "
          f"{args.max_tokens} tokens per answer, greedy, streamed\n")
    print_table(results, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
