#!/usr/bin/env python3
"""Scale-out benchmark: 3 replicas behind `cairn route`, on this machine.

Three setups, the same workloads, one run, in turn:

  round-robin     the router sends requests to the replicas in turn; the
                  replicas share nothing (no Redis): every replica computes
                  every document it is asked about for the first time
  cache-aware     the router sends each request to the replica whose page
                  events say it holds the longest prefix (replicas publish
                  events, --shared-write none: no pages in Redis)
  cache+shared    the same, and the replicas share pages through Redis
                  (--shared-cache, pages seen twice): a replica that is sent
                  a document another one computed loads it from Redis

Workloads, over the OpenAI HTTP API through the router:
  rag   D documents of W words, each asked A times (different questions),
        in a shuffled order, C requests at once (streamed, max_tokens 8)
  hot   the same with few documents asked many times by many clients at
        once: the replica holding a document gets loaded and the router
        sends some requests elsewhere, where the shared tier saves the
        recompute
  failover  every document asked twice, then the replica that served the
        most is killed and every document asked twice again: the others
        recompute its documents, or (shared tier) load them from Redis
  chat  S conversations of T turns each, the whole conversation resent
        every turn (how OpenAI clients talk; with --session-ids also a
        session_id, which keeps a conversation on one replica under any
        policy), C at once

Per setup and workload: prompt tokens the replicas computed (prompt tokens
minus cached, summed over the replicas' /metrics), that against
round-robin, time to first token p50/p99, requests per second. The goal
(issue 20): cache+shared computes at most 0.35x of round-robin on rag.

Usage: bench_scale.py [--model M.gguf] [--threads 1] [--docs 8] [--asks 3] ...
Speed figures from this 2-core machine are noisy; the computed-token
ratios are what the routing decides and do not depend on speed.
"""
import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
import harness  # noqa: E402
from redis_server import RedisServer  # noqa: E402
import routers  # noqa: E402

GUARD_S = 600


class Router:
    """`cairn route ARGS`, waited for until it prints its listening line."""

    def __init__(self, binary, args, log_path):
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen([binary, "route", *args], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        ready = threading.Event()
        self.http_port = None

        def drain():
            for line in self.proc.stderr:
                self.log.write(line)
                self.log.flush()
                if "listening" in line and self.http_port is None:
                    words = line.replace(",", " ").split()
                    self.http_port = int(words[words.index("http") + 1].rsplit(":", 1)[1])
                    ready.set()
            ready.set()
        threading.Thread(target=drain, daemon=True).start()
        if not ready.wait(GUARD_S) or self.http_port is None:
            raise RuntimeError("cairn route did not start; see " + log_path)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def post_stream(port, path, body):
    """POST a streamed request; (seconds to the first content chunk, the
    usage of the last chunk)."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    ttft, usage = None, None
    with urllib.request.urlopen(req, timeout=GUARD_S) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if ttft is None and chunk.get("choices"):
                ttft = time.monotonic() - t0
            if chunk.get("usage"):
                usage = chunk["usage"]
    return ttft if ttft is not None else time.monotonic() - t0, usage


def router_health(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/router/health", timeout=60) as r:
            return json.loads(r.read())
    except OSError:
        return {}


def computed_tokens(replicas):
    """Prompt tokens the replicas computed: looked up minus served from cache."""
    return routers.computed_tokens([r.http_port for r in replicas])


def rag_workload(args, rng, n_docs, n_asks, doc_words):
    words = harness.WORDS
    docs = []
    for i in range(n_docs):
        start = (i * 7919) % (len(words) - doc_words)
        docs.append(f"Document {i}.\n" + " ".join(words[start:start + doc_words]))
    asks = [(d, q) for d in range(n_docs) for q in range(n_asks)]
    rng.shuffle(asks)
    return [("/v1/completions",
             {"prompt": f"{docs[d]}\n\nQuestion {q}: what happened to {words[q * 13 % 500]}?\n",
              "max_tokens": 8, "temperature": 0}) for d, q in asks]


def run_requests(port, items, concurrency):
    """items run `concurrency` at once, in order; (ttfts, wall seconds)."""
    ttfts, lock, it = [], threading.Lock(), iter(items)

    def worker():
        while True:
            with lock:
                item = next(it, None)
            if item is None:
                return
            t, _ = post_stream(port, *item)
            with lock:
                ttfts.append(t)
    t0 = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return ttfts, time.monotonic() - t0


def run_chat(port, args, rng):
    """S conversations of T turns, each turn after the previous reply, the
    conversations interleaved C at a time."""
    words = harness.WORDS
    ttfts, lock = [], threading.Lock()
    convs = list(range(args.sessions))

    def converse(s):
        at = (s * 211) % (len(words) - args.system_words)  # the stories text has ~1000 words
        system = " ".join(words[at:at + args.system_words])
        msgs = [{"role": "system", "content": system}]
        for t in range(args.turns):
            msgs.append({"role": "user", "content": f"Turn {t}: tell me about "
                         f"{words[(s * 31 + t * 17) % 900]}."})
            body = {"messages": msgs, "max_tokens": 12, "temperature": 0}
            if args.session_ids:
                body["session_id"] = f"bench-{s}"  # the router then keeps it on one replica
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                         data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            t0 = time.monotonic()
            with urllib.request.urlopen(req, timeout=GUARD_S) as r:
                reply = json.loads(r.read())
            with lock:
                ttfts.append(time.monotonic() - t0)  # not streamed: time to the whole reply
            msgs.append({"role": "assistant",
                         "content": reply["choices"][0]["message"]["content"]})
    t0 = time.monotonic()
    pending, lock2 = iter(convs), threading.Lock()

    def worker():
        while True:
            with lock2:
                s = next(pending, None)
            if s is None:
                return
            converse(s)
    threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return ttfts, time.monotonic() - t0


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


SETUPS = (
    ("round-robin", "round-robin", None),
    ("cache-aware", "cache", "none"),
    ("cache+shared", "cache", "reused"),
)


def run_setup(args, name, policy, shared_write, workload, tmp):
    rng = random.Random(args.seed)
    work = os.path.join(tmp, f"{name}-{workload}")
    os.makedirs(work)
    redis = RedisServer(work)
    replicas, router = [], None
    dead_computed = 0
    try:
        for i in range(args.replicas):
            extra = ["-t", str(args.threads), "--cache-dir", os.path.join(work, f"r{i}")]
            if shared_write:
                extra += ["--shared-cache", redis.url, "--shared-write", shared_write,
                          "--replica-id", f"r{i}"]
            replicas.append(harness.Server(args.binary, ["-m", args.model, "-c", str(args.ctx),
                                                         *extra], http=True))
        rargs = ["-m", args.model, "--http-port", "0", "--shared-cache", redis.url,
                 "--policy", policy]
        for i, r in enumerate(replicas):
            rargs += ["--replica", f"http={r.http_host}:{r.http_port},rpc={r.host}:{r.port},id=r{i}"]
        router = Router(args.binary, rargs, os.path.join(work, "router.log"))
        if workload == "rag":
            ttfts, wall = run_requests(router.http_port,
                                       rag_workload(args, rng, args.docs, args.asks, args.doc_words),
                                       args.concurrency)
        elif workload == "failover":
            # phase 1: every document asked twice; then the replica that
            # served the most is killed (what it computed is counted first),
            # the router notices, and every document is asked again
            items = rag_workload(args, rng, args.docs, 4, args.doc_words)
            t1, w1 = run_requests(router.http_port, items[0::2], args.concurrency)
            done = [computed_tokens([r]) for r in replicas]
            victim = max(range(len(replicas)), key=lambda i: done[i])
            dead_computed = done[victim]
            replicas[victim].kill()
            harness.poll(lambda: router_health(router.http_port),
                         lambda h: h.get("replicas_up") == len(replicas) - 1, guard=GUARD_S)
            t2, w2 = run_requests(router.http_port, items[1::2], args.concurrency)
            replicas.pop(victim)
            ttfts, wall = t1 + t2, w1 + w2
        elif workload == "hot":
            ttfts, wall = run_requests(router.http_port,
                                       rag_workload(args, rng, args.hot_docs, args.hot_asks,
                                                    args.doc_words),
                                       args.hot_concurrency)
        else:
            ttfts, wall = run_chat(router.http_port, args, rng)
        return {"computed": computed_tokens(replicas) + dead_computed, "n": len(ttfts),
                "p50": percentile(ttfts, 50), "p99": percentile(ttfts, 99),
                "rps": len(ttfts) / wall}
    finally:
        if router:
            router.stop()
        for r in replicas:
            r.kill()
        redis.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_model = os.path.join(ROOT, "models", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    if not os.path.exists(default_model):
        default_model = os.path.join(ROOT, "models", "stories260K.gguf")
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "cairn"))
    ap.add_argument("--model", default=default_model)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--docs", type=int, default=4)
    ap.add_argument("--doc-words", type=int, default=200)
    ap.add_argument("--asks", type=int, default=6)
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system-words", type=int, default=120)
    ap.add_argument("--concurrency", type=int, default=3)
    ap.add_argument("--session-ids", action="store_true",
                    help="chat turns carry a session_id (sticky under every policy)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hot-docs", type=int, default=2)
    ap.add_argument("--hot-asks", type=int, default=10)
    ap.add_argument("--hot-concurrency", type=int, default=6)
    ap.add_argument("--workloads", default="rag,hot,failover,chat")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="cairn-bench-scale-")
    results = {}
    for workload in args.workloads.split(","):
        for name, policy, shared_write in SETUPS:
            print(f"# {workload}: {name} ...", file=sys.stderr, flush=True)
            results[(workload, name)] = run_setup(args, name, policy, shared_write, workload, tmp)
    print(f"model {os.path.basename(args.model)}, {args.replicas} replicas x {args.threads} "
          f"thread(s); rag: {args.docs} docs x {args.doc_words} words x {args.asks} asks, "
          f"{args.concurrency} at once; hot: {args.hot_docs} docs x {args.hot_asks} asks, "
          f"{args.hot_concurrency} at once; chat: {args.sessions} conversations x {args.turns} "
          f"turns, {args.concurrency} at once")
    print(f"| workload | setup | requests | computed prompt tokens | vs round-robin | "
          f"TTFT p50 (s) | TTFT p99 (s) | req/s |")
    print("|---|---|---|---|---|---|---|---|")
    for (workload, name), r in results.items():
        base = results[(workload, "round-robin")]["computed"]
        print(f"| {workload} | {name} | {r['n']} | {r['computed']} | "
              f"{r['computed'] / base if base else float('nan'):.2f}x | {r['p50']:.3f} | "
              f"{r['p99']:.3f} | {r['rps']:.2f} |")
    print("(chat: time to the whole reply, not streamed)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{w}/{n}": r for (w, n), r in results.items()}, f, indent=1)


if __name__ == "__main__":
    main()
