#!/usr/bin/env python3
"""Speculation under concurrent load: issue 35 asks that speculating never
costs more than 3% against plain decoding, at batch 1 (bench_spec.py) and
with several requests decoding at once (this script).

For each cairn config (plain first, then each --methods entry) one server is
started with --max-seqs CLIENTS; CLIENTS clients send the same mix of the
bench's workloads at the same time (client i takes the mix from position i,
so different workloads share the batches), greedy, max_tokens -n. Reported
per config: the aggregate decode rate (completion tokens of all requests
over the wall time of the round, prompts included), its ratio to plain,
and whether every answer was token for token the plain server's (the
scheduler's batching must not change a request's tokens).

    python3 bench/spec/bench_concurrent.py -c 4 --methods suffix,draft -r 2

Rounds alternate the configs (plain, methods, plain, methods...) and the
table shows each config's median, so drift of a shared machine hits all
alike.
"""
import argparse
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_spec as B  # noqa: E402
from workloads import WORKLOADS  # noqa: E402

MIX = ["story", "code", "rag", "story", "code", "repeat4", "rag", "story"]


def one_round(port, clients, n_predict, args):
    """Every client's requests, at once. Returns (tokens, wall seconds,
    {(client, i): text})."""
    texts, tokens, errors = {}, [0] * clients, []

    def client(c):
        try:
            for i in range(len(MIX) // 2):
                w = WORKLOADS[MIX[(c + i) % len(MIX)]]
                msgs = w["messages"] if "messages" in w else w["requests"][0]
                body = B.request_body(w, args, n_predict, msgs)
                r = B.chat(port, body, False, args.request_timeout)
                texts[(c, i)] = r["text"]
                tokens[c] += (r["usage"] or {}).get("completion_tokens") or 0
        except Exception as e:  # a failed request fails the round, visibly
            errors.append("client %d: %s" % (c, e))

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError("; ".join(errors))
    return sum(tokens), wall, texts


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cairn", default="build/cairn")
    ap.add_argument("--model", default="models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    ap.add_argument("--draft-model", default="models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    ap.add_argument("--methods", default="suffix,draft")
    ap.add_argument("-c", "--clients", type=int, default=4)
    ap.add_argument("-n", "--n-predict", type=int, default=96)
    ap.add_argument("-r", "--rounds", type=int, default=2)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--port-base", type=int, default=18600)
    ap.add_argument("--request-timeout", type=float, default=1800)
    ap.add_argument("--serve-args", default="",
                    help="more `cairn serve` arguments for the speculating configs, "
                         "space-separated (e.g. '--draft-max-batch 1')")
    args = ap.parse_args()
    args.methods = [m for m in args.methods.split(",") if m and m != "none"]
    args.eagle_head = args.medusa_heads = None
    configs = [c for c in B.cairn_configs(args) if c.argv]
    for c in configs:  # as many sequences as clients
        i = c.argv.index("--max-seqs")
        c.argv[i + 1] = str(args.clients)
        if not c.plain:
            c.argv += args.serve_args.split()
    model, isa, _ = B.cpu_info()
    print("cpu: %s, %d cpus, %s; %d clients, -n %d, %d rounds"
          % (model, os.cpu_count(), " ".join(isa), args.clients, args.n_predict, args.rounds),
          file=sys.stderr)
    logdir = "/tmp/bench-spec-concurrent-%d" % os.getpid()
    os.makedirs(logdir, exist_ok=True)
    rates = {c.label: [] for c in configs}
    plain_texts, same = None, {c.label: True for c in configs}
    for rnd in range(args.rounds):
        for k, c in enumerate(configs):
            srv = B.Server(c, args.port_base + k, 300, logdir)
            try:
                B.chat(srv.port, B.request_body(WORKLOADS["story"], args, 8), False, 600)
                tok, wall, texts = one_round(srv.port, args.clients, args.n_predict, args)
            finally:
                srv.stop()
            rates[c.label].append(tok / wall)
            if c.plain and plain_texts is None:
                plain_texts = texts
            elif plain_texts is not None and texts != plain_texts:
                same[c.label] = False
            print("round %d  %-40s %5d tokens in %6.1f s: %6.2f tok/s"
                  % (rnd + 1, c.label, tok, wall, tok / wall), file=sys.stderr, flush=True)
    plain = statistics.median(rates[configs[0].label])
    print("\n%s, %d cpus (%s); %d clients at once, -n %d, median of %d rounds\n"
          % (model, os.cpu_count(), " ".join(isa), args.clients, args.n_predict, args.rounds))
    print("| config | aggregate tok/s | vs plain | same tokens as plain |")
    print("|---|---:|---:|---|")
    for c in configs:
        r = statistics.median(rates[c.label])
        print("| %s | %.2f | %.2f× | %s |" % (c.label, r, r / plain,
                                             "yes" if same[c.label] else "**no**"))


if __name__ == "__main__":
    main()
