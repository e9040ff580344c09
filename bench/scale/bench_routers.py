#!/usr/bin/env python3
"""cairn behind the routers people deploy: 3 replicas, the same workloads
through each router, one run.

Setups: vllm-router round_robin (the baseline), vllm-router cache_aware,
vllm-router kv_aware fed by the replicas' --kv-events, sglang-router
cache_aware, and `cairn route` (its replicas publish page events to a Redis
it reads). Fresh replicas for every setup and workload.

Workloads (the OpenAI HTTP API, streamed):
  rag   D documents x A questions, interleaved, C at once
  hot   few documents asked many times by many clients at once
  chat  S conversations x T turns, the whole conversation resent each turn
        with a session_id, C conversations at once

Per setup and workload: prompt tokens the replicas computed (their /metrics:
looked up minus served from cache), that against round_robin and against
the floor (rag and hot: every prompt's tokens past its longest prefix shared
with an earlier one), TTFT p50/p99, requests per second.

--shared-write all starts the replicas so that one finding a prefix being
computed by another waits for its pages (docs/scale-out.md, "Computing a
prefix once across replicas"); the default, none, is routing alone. The computed-token ratios are what routing decides and
do not depend on this machine's speed; the times do.

usage: bench_routers.py [--model M.gguf] [--workloads rag,hot,chat] [--json OUT]
"""
import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
sys.path.insert(0, HERE)
import harness  # noqa: E402
import routers  # noqa: E402
from bench_scale import percentile, post_stream, run_chat  # noqa: E402
from redis_server import RedisServer  # noqa: E402

SETUPS = ("round_robin", "cache_aware", "kv_aware", "sglang-router", "cairn route")


def start_replicas(args, work, redis_url, tag):
    servers, events = [], {}
    for i in range(args.replicas):
        http, pub, rep = routers.free_port(), routers.free_port(), routers.free_port()
        srv = harness.Server(args.binary, [
            "-m", args.model, "-t", str(args.threads), "-c", str(args.ctx),
            "--http-port", str(http), "--cache-dir", os.path.join(work, f"r{i}"),
            "--kv-events", f"tcp://127.0.0.1:{pub}", "--kv-events-replay", f"tcp://127.0.0.1:{rep}",
            "--shared-cache", redis_url, "--shared-write", args.shared_write,
            "--replica-id", f"{tag}-r{i}"])
        servers.append(srv)
        events[f"http://127.0.0.1:{http}"] = (f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{rep}")
    return servers, events


def run_items(port, items, concurrency):
    ttfts, lock, it = [], threading.Lock(), iter(items)

    def worker():
        while True:
            with lock:
                body = next(it, None)
            if body is None:
                return
            t, _ = post_stream(port, "/v1/chat/completions", body)
            with lock:
                ttfts.append(t)
    t0 = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return ttfts, time.monotonic() - t0


def run_setup(args, setup, workload, tmp, tok):
    tag = f"{setup.replace(' ', '-')}-{workload}"
    work = os.path.join(tmp, tag)
    os.makedirs(work)
    redis = RedisServer(work)
    servers, router, floor = [], None, None
    try:
        servers, events = start_replicas(args, work, redis.url, tag)
        urls = list(events)
        log = os.path.join(work, "router.log")
        if setup == "cairn route":
            router = routers.CairnRoute(args.binary, args.model, servers, redis.url, log,
                                        ids=[f"{tag}-r{i}" for i in range(len(servers))])
        elif setup == "sglang-router":
            router = routers.SglangRouter(urls, log)
        else:
            router = routers.VllmRouter(setup, urls, log, events=events, tokenizer=tok)
        if workload == "chat":
            ns = argparse.Namespace(**vars(args), session_ids=True)
            ttfts, wall = run_chat(router.port, ns, random.Random(args.seed))
        else:
            docs, asks, conc = ((args.docs, args.asks, args.concurrency) if workload == "rag"
                                else (args.hot_docs, args.hot_asks, args.hot_concurrency))
            items = [b for _, b in routers.rag_requests(harness.WORDS, docs, asks, args.doc_words,
                                                        seed=args.seed)]
            ttfts, wall = run_items(router.port, items, conc)
        computed = routers.computed_tokens([s.http_port for s in servers])
        if workload != "chat":
            floor = routers.floor_tokens(servers[0].http_port, [(0, b) for b in items])
        return {"computed": computed, "floor": floor,
                "n": len(ttfts), "p50": percentile(ttfts, 50), "p99": percentile(ttfts, 99),
                "rps": len(ttfts) / wall}
    finally:
        if router:
            router.kill()
        for s in servers:
            s.kill()
        redis.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "cairn"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models",
                                                    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--docs", type=int, default=3)
    ap.add_argument("--asks", type=int, default=4)
    ap.add_argument("--doc-words", type=int, default=220)
    ap.add_argument("--concurrency", type=int, default=3)
    ap.add_argument("--hot-docs", type=int, default=2)
    ap.add_argument("--hot-asks", type=int, default=8)
    ap.add_argument("--hot-concurrency", type=int, default=6)
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system-words", type=int, default=120)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workloads", default="rag,hot,chat")
    ap.add_argument("--setups", default=",".join(SETUPS))
    ap.add_argument("--shared-write", default="none", choices=("none", "reused", "all"))
    ap.add_argument("--json")
    args = ap.parse_args()
    why = routers.have_routers()
    if why:
        sys.exit("bench_routers: " + why)
    tmp = tempfile.mkdtemp(prefix="cairn-bench-routers-")
    tok = routers.tokenizer_folder(args.model, os.path.join(tmp, "tokenizer"))
    results = {}
    for workload in args.workloads.split(","):
        for setup in args.setups.split(","):
            print(f"# {workload}: {setup} ...", file=sys.stderr, flush=True)
            results[(workload, setup)] = run_setup(args, setup, workload, tmp, tok)
    print(f"model {os.path.basename(args.model)}, {args.replicas} replicas x {args.threads} "
          f"thread(s); rag {args.docs} docs x {args.asks} asks ({args.doc_words} words), "
          f"{args.concurrency} at once; hot {args.hot_docs} x {args.hot_asks}, "
          f"{args.hot_concurrency} at once; chat {args.sessions} x {args.turns} turns with "
          f"session ids, {args.concurrency} at once; replicas --shared-write {args.shared_write}")
    print("| workload | router | requests | computed prompt tokens | vs round_robin | vs floor | "
          "TTFT p50 (s) | TTFT p99 (s) | req/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (workload, setup), r in results.items():
        base = results.get((workload, "round_robin"), {}).get("computed")
        ratio = f"{r['computed'] / base:.2f}x" if base else "-"
        vs_floor = f"{r['computed'] / r['floor']:.2f}x" if r.get("floor") else "-"
        print(f"| {workload} | {setup} | {r['n']} | {r['computed']} | {ratio} | {vs_floor} | "
              f"{r['p50']:.3f} | {r['p99']:.3f} | {r['rps']:.2f} |")
    print("(chat: time to the whole reply, not streamed)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{w}/{s}": r for (w, s), r in results.items()}, f, indent=1)


if __name__ == "__main__":
    main()
