#!/usr/bin/env python3
"""Persistent prefix cache benchmark: where a prefix's KV comes from, and
what that does to time-to-first-token; and how long idle sessions take to
resume after a restart.

Part 1 — TTFT by tier. One prompt of >= 2048 tokens (--doc-tokens), greedy,
streamed (TTFT = request sent -> first streamed delta, at the client), on a
server with a small tier 0 (--kv-mem: the prompt plus a quarter), a host-RAM
tier and an LMDB tier. For each of --reps different prompts:
  cold      first time: every token computed
  tier 0    the same prompt again: its pages are on the device
  host RAM  after two other prompts of the same size have pushed it out of
            tier 0 (LRU eviction moves pages down a tier)
then SIGTERM (the server writes back what is not on disk), a restart over
the same --cache-dir, and for each prompt again:
  disk      the tree is empty; the match continues by page hash in LMDB
Reported: TTFT median / min per phase, median ratio to cold, and where the
cached tokens were found (usage.cached_tokens_by_tier), so a phase whose
pages were not where it meant them to be is visible.

Part 2 — resume idle sessions. --sessions sessions (shared system prompt +
a distinct user message, one generated turn each) are opened, the server is
stopped with SIGTERM and restarted over the same cache dir, then every
session takes one more turn (--resume-concurrency connections). Reported:
set-up time, shutdown (write-back) and start-up times, the resume turns'
total wall time, per-session latency and TTFT, and where their history came
from. Baseline (unless --no-baseline): the same second turns on a fresh
server without a cache dir, each session re-opened from its token history,
so the history is recomputed (the shared system prompt is still cached after
its first use there, as any server would). The resumed and recomputed
outputs are compared token for token.

The bundled model (models/stories260K.gguf) gets `-c 4096` so a 2048-token
prompt fits. This is a measurement script, not a test.

usage: bench/persist/bench_persist.py [--bin build/cairn] [--reps 5] [--sessions 1000]
                                      [--parts ttft,resume] [--json out.json] [...]
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
from cairn_client import Delta  # noqa: E402
from cairn_client.launch import ServerProcess  # noqa: E402

TIERS = ("device", "host", "disk")
NAMES = ["Max", "Sue", "Lily", "Tom", "Ben", "Mia", "Sam", "Anna", "Zoe", "Leo"]
THINGS = ["the ball", "the garden", "the birds", "the stick", "the tree", "the mud",
          "the fence", "the house", "the boat", "the cake"]
SYSTEM = ("You are a friendly storyteller for small children. You answer in short, simple "
          "sentences. You like stories about animals, parks, balls and gardens, and every story "
          "ends happily.")


def percentile(xs, q):
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(round(q / 100.0 * len(s) + 0.5)) - 1))
    return s[k]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class Bench:
    def __init__(self, args):
        self.args = args
        self.tmp = tempfile.mkdtemp(prefix="cairn-bench-persist-")
        self.servers = []

    def close(self):
        for s in self.servers:
            s.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def serve(self, *extra, cache_dir=None):
        args = ["-m", self.args.model, "-c", str(self.args.ctx), *self.args.server_args]
        if cache_dir:
            args += ["--cache-dir", cache_dir]
        srv = ServerProcess(self.args.bin, args + list(extra), start_timeout=600)
        self.servers.append(srv)
        return srv

    def restart(self, srv):
        """SIGTERM + wait (write-back), start again; (new server, stop s, start s)."""
        t0 = time.perf_counter()
        rc = srv.stop(600)
        t1 = time.perf_counter()
        if rc != 0:
            raise RuntimeError(f"SIGTERM ended the server with status {rc}:\n{srv.log()}")
        new = ServerProcess(srv.binary, srv.args, start_timeout=600)
        self.servers.append(new)
        return new, t1 - t0, time.perf_counter() - t1

    @staticmethod
    def warm_up(c):
        # one unrelated request so start-up costs (page faults, thread pool)
        # do not land in a measured TTFT
        c.generate(prompt="Warm up.", max_tokens=4, temperature=0)

    @staticmethod
    def timed(start_stream):
        """(ttft s, total s, result) of one streamed generation."""
        t0 = time.perf_counter()
        stream = start_stream()
        first = None
        for item in stream:
            if first is None and isinstance(item, Delta):
                first = time.perf_counter() - t0
        total = time.perf_counter() - t0
        return (first if first is not None else total), total, stream.result

    # ------------------------------------------------------------------
    def documents(self, c, n):
        """n different documents of at most --doc-tokens tokens each (the
        longest whole-word prefix): the source text rotated by a different
        offset each, so no two share a page."""
        with open(self.args.text) as f:
            words = f.read().split()
        docs = []
        for k in range(n):
            rot = words[(k * 97) % len(words):] + words[:(k * 97) % len(words)]
            rot = [f"{NAMES[k % len(NAMES)]}'s book, part {k + 1}."] + rot
            while len(rot) < 2 * self.args.doc_tokens:
                rot = rot + rot
            lo, hi = 1, len(rot)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if len(c.tokenize(" ".join(rot[:mid]))) <= self.args.doc_tokens:
                    lo = mid
                else:
                    hi = mid - 1
            docs.append(" ".join(rot[:lo]))
        return docs

    def page_bytes(self):
        """KV bytes per page of this model and settings (device tier bytes /
        pages once a server holds something)."""
        srv = self.serve()
        try:
            with srv.client() as c:
                c.generate(prompt="Once upon a time", max_tokens=40, temperature=0)
                d = c.cache_stats()["tiers"]["device"]
                return d["bytes"] // d["pages"], c.info()["page_size"]
        finally:
            srv.kill()

    def run_ttft(self):
        a = self.args
        page_bytes, P = self.page_bytes()
        prompt_pages = (a.doc_tokens + a.max_tokens) // P + 1
        kv_pages = prompt_pages + prompt_pages // 4 + 4
        cache = os.path.join(self.tmp, "ttft-cache")
        srv = self.serve("--kv-mem", str(kv_pages * page_bytes), "--host-mem", a.host_mem,
                         cache_dir=cache)
        c = srv.client(timeout=600)
        docs = self.documents(c, a.reps)
        fillers = self.documents(c, a.reps + 2)[a.reps:]  # 2 more, never measured
        n_tokens = [len(c.tokenize(d)) for d in docs]
        self.warm_up(c)
        phases = {p: [] for p in ("cold", "tier 0", "host RAM", "disk")}

        def one(phase, doc):
            ttft, _, r = self.timed(lambda: c.generate(prompt=doc, max_tokens=a.max_tokens,
                                                       temperature=0, stream=True))
            phases[phase].append({"ttft_s": ttft, "prompt_tokens": r.usage.prompt_tokens,
                                  "cached_tokens": r.usage.cached_tokens,
                                  "by_tier": dict(r.usage.cached_tokens_by_tier),
                                  "tokens": r.tokens})

        for k, doc in enumerate(docs):
            log(f"ttft: prompt {k + 1}/{a.reps} ({n_tokens[k]} tokens): cold, tier 0, host")
            one("cold", doc)
            one("tier 0", doc)
            for f in fillers:  # push it out of tier 0: LRU moves it down to host RAM
                c.generate(prompt=f, max_tokens=a.max_tokens, temperature=0)
            one("host RAM", doc)
        stats_before = c.cache_stats()
        c.close()
        log("ttft: SIGTERM + restart over the same cache dir")
        srv, stop_s, start_s = self.restart(srv)
        c = srv.client(timeout=600)
        self.warm_up(c)
        for k, doc in enumerate(docs):
            log(f"ttft: prompt {k + 1}/{a.reps}: disk")
            one("disk", doc)
        stats_after = c.cache_stats()
        c.close()
        srv.stop(600)

        same = all(phases[p][k]["tokens"] == phases["cold"][k]["tokens"]
                   for p in phases for k in range(a.reps))
        out = {"doc_tokens": n_tokens, "page_size": P, "page_bytes": page_bytes,
               "kv_pages": kv_pages, "stop_s": stop_s, "start_s": start_s,
               "outputs_identical": same, "phases": {}, "cache_stats_before_restart":
               stats_before, "cache_stats_after": stats_after}
        cold = statistics.median(x["ttft_s"] for x in phases["cold"])
        for p, xs in phases.items():
            med = statistics.median(x["ttft_s"] for x in xs)
            prompt = sum(x["prompt_tokens"] for x in xs)
            out["phases"][p] = {
                "ttft_median_ms": 1000 * med,
                "ttft_min_ms": 1000 * min(x["ttft_s"] for x in xs),
                "ratio_to_cold": med / cold,
                "cached_fraction": sum(x["cached_tokens"] for x in xs) / max(1, prompt),
                "by_tier_fraction": {t: sum(x["by_tier"].get(t, 0) for x in xs) / max(1, prompt)
                                     for t in TIERS},
                "ttft_ms": [1000 * x["ttft_s"] for x in xs],
            }
        return out

    # ------------------------------------------------------------------
    def run_resume(self):
        a = self.args
        cache = os.path.join(self.tmp, "resume-cache")
        srv = self.serve("--host-mem", a.host_mem, "--max-sessions",
                         str(max(4096, 2 * a.sessions)), cache_dir=cache)
        conns = [srv.client(timeout=600) for _ in range(a.setup_concurrency)]
        self.warm_up(conns[0])
        with open(self.args.text) as f:
            words = f.read().split()

        def user_msg(i, turn):
            # turn 1 carries a story excerpt of its own (a different window of
            # the text for each session), so most of a session's history is
            # its own pages, not the shared system prompt's
            if turn == 1:
                start = (i * 37) % len(words)
                excerpt = " ".join((words + words)[start:start + a.excerpt_words])
                return {"role": "user",
                        "content": f"{NAMES[i % len(NAMES)]} read this story (number {i}): "
                                   f"{excerpt} What happens next?"}
            return {"role": "user",
                    "content": f"And what did {NAMES[(i // len(NAMES)) % len(NAMES)]} do with "
                               f"{THINGS[(i * 7) % len(THINGS)]}?"}

        def open_one(i):
            c = conns[i % len(conns)]
            msgs = [{"role": "system", "content": SYSTEM}, user_msg(i, 1)]
            sid = c.session_open(messages=msgs)["session_id"]
            r = c.session_generate(sid, max_tokens=a.turn_tokens, temperature=0)
            rendered = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in msgs)
            return sid, c.tokenize(rendered) + r.tokens

        log(f"resume: opening {a.sessions} sessions with one turn each")
        t0 = time.perf_counter()
        with ThreadPoolExecutor(len(conns)) as pool:
            sessions = list(pool.map(open_one, range(a.sessions)))
        setup_s = time.perf_counter() - t0
        for c in conns:
            c.close()
        hist_tokens = [len(h) for _, h in sessions]

        log("resume: SIGTERM + restart over the same cache dir")
        srv, stop_s, start_s = self.restart(srv)

        def second_turns(server, sids, label):
            log(f"resume: second turn on {len(sids)} sessions ({label})")
            cs = [server.client(timeout=600) for _ in range(a.resume_concurrency)]
            self.warm_up(cs[0])
            res = [None] * len(sids)

            def one(i):
                c = cs[i % len(cs)]
                res[i] = self.timed(lambda: c.session_generate(
                    sids[i], messages=[user_msg(i, 2)], max_tokens=a.turn_tokens,
                    temperature=0, stream=True))

            t = time.perf_counter()
            with ThreadPoolExecutor(len(cs)) as pool:
                list(pool.map(one, range(len(sids))))
            wall = time.perf_counter() - t
            st = cs[0].cache_stats()
            for c in cs:
                c.close()
            return wall, res, st

        info_ok = 0
        with srv.client(timeout=600) as c:
            for sid, h in sessions:
                info_ok += c.session_info(sid)["n_tokens"] == len(h)
        wall, res, stats = second_turns(srv, [sid for sid, _ in sessions], "resumed")
        srv.stop(600)

        def summary(wall, res):
            lat = [r[1] for r in res]
            ttft = [r[0] for r in res]
            prompt = sum(r[2].usage.prompt_tokens for r in res)
            return {"wall_s": wall, "per_session_ms": 1000 * wall / len(res),
                    "latency_mean_ms": 1000 * statistics.mean(lat),
                    "latency_p50_ms": 1000 * percentile(lat, 50),
                    "latency_p99_ms": 1000 * percentile(lat, 99),
                    "ttft_p50_ms": 1000 * percentile(ttft, 50),
                    "ttft_p99_ms": 1000 * percentile(ttft, 99),
                    "prompt_tokens": prompt,
                    "sessions_with_disk_hits": sum(
                        r[2].usage.cached_tokens_by_tier.get("disk", 0) > 0 for r in res),
                    "cached_fraction": sum(r[2].usage.cached_tokens for r in res) / max(1, prompt),
                    "by_tier_fraction": {
                        t: sum(r[2].usage.cached_tokens_by_tier.get(t, 0) for r in res)
                        / max(1, prompt) for t in TIERS}}

        out = {"sessions": a.sessions, "history_tokens_mean": statistics.mean(hist_tokens),
               "setup_s": setup_s, "stop_s": stop_s, "start_s": start_s,
               "session_info_ok": info_ok, "resumed": summary(wall, res),
               "cache_stats_after": stats}
        if not a.no_baseline:
            base = self.serve("--max-sessions", str(max(4096, 2 * a.sessions)))
            with base.client(timeout=600) as c:
                sids = [c.session_open(tokens=h)["session_id"] for _, h in sessions]
            bwall, bres, _ = second_turns(base, sids, "baseline: history recomputed")
            base.kill()
            out["baseline"] = summary(bwall, bres)
            out["outputs_identical"] = sum(r[2].tokens == b[2].tokens for r, b in zip(res, bres))
        return out


def table(cols, rows):
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    print("| " + " | ".join(c.ljust(w) for c, w in zip(cols, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(v.ljust(w) for v, w in zip(r, widths)) + " |")


def tiers_str(fr):
    return " / ".join(f"{fr[t]:.2f}" for t in TIERS)


def report(args, out):
    if "ttft" in out:
        t = out["ttft"]
        print(f"\nTTFT by tier: {args.reps} prompts of {min(t['doc_tokens'])}-"
              f"{max(t['doc_tokens'])} tokens, {args.max_tokens} generated, greedy, streamed; "
              f"page {t['page_size']} ({t['page_bytes']} B), tier 0 = {t['kv_pages']} pages, "
              f"host {args.host_mem}, -c {args.ctx}\n")
        rows = []
        for p, s in t["phases"].items():
            rows.append([p, f"{s['ttft_median_ms']:.2f}", f"{s['ttft_min_ms']:.2f}",
                         f"{s['ratio_to_cold']:.3f}", f"{s['cached_fraction']:.3f}",
                         tiers_str(s["by_tier_fraction"])])
        table(["prefix", "TTFT median ms", "TTFT min ms", "ratio to cold", "cached frac",
               "device / host / disk"], rows)
        print(f"\nrestart: SIGTERM to exit {t['stop_s']:.2f} s, start to listening "
              f"{t['start_s']:.2f} s; outputs identical in every phase: {t['outputs_identical']}")
    if "resume" in out:
        r = out["resume"]
        print(f"\nResume {r['sessions']} idle sessions (history {r['history_tokens_mean']:.0f} "
              f"tokens on average; one turn of {args.turn_tokens} tokens each, "
              f"{args.resume_concurrency} connection(s)); set-up {r['setup_s']:.1f} s, "
              f"SIGTERM to exit {r['stop_s']:.2f} s, restart to listening {r['start_s']:.2f} s, "
              f"session.info right after restart: {r['session_info_ok']}/{r['sessions']}\n")
        rows = []
        for name in ("resumed", "baseline"):
            if name not in r:
                continue
            s = r[name]
            rows.append([name if name == "resumed" else "recomputed (fresh server)",
                         f"{s['wall_s']:.2f}", f"{s['per_session_ms']:.2f}",
                         f"{s['latency_p50_ms']:.2f}", f"{s['latency_p99_ms']:.2f}",
                         f"{s['ttft_p50_ms']:.2f}", f"{s['cached_fraction']:.3f}",
                         tiers_str(s["by_tier_fraction"])])
        table(["second turn", "total s", "per session ms", "lat p50 ms", "lat p99 ms",
               "TTFT p50 ms", "cached frac", "device / host / disk"], rows)
        print(f"\nresumed sessions whose history was (partly) read from disk: "
              f"{r['resumed']['sessions_with_disk_hits']}/{r['sessions']}")
        if "baseline" in r:
            print(f"\nrecomputed/resumed total time: "
                  f"{r['baseline']['wall_s'] / max(r['resumed']['wall_s'], 1e-9):.2f}x; "
                  f"outputs identical: {r['outputs_identical']}/{r['sessions']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "cairn"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "stories260K.gguf"))
    ap.add_argument("--text", default=os.path.join(ROOT, "tests", "data", "text", "stories.txt"))
    ap.add_argument("--parts", default="ttft,resume")
    ap.add_argument("--ctx", type=int, default=4096, help="-c for the server")
    ap.add_argument("--doc-tokens", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=5, help="different prompts per TTFT phase")
    ap.add_argument("--max-tokens", type=int, default=4, help="tokens generated per TTFT request")
    ap.add_argument("--host-mem", default="256M")
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--turn-tokens", type=int, default=16)
    ap.add_argument("--excerpt-words", type=int, default=60,
                    help="words of story excerpt in each session's first message")
    ap.add_argument("--setup-concurrency", type=int, default=8)
    ap.add_argument("--resume-concurrency", type=int, default=1)
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--server-arg", dest="server_args", action="append", default=[],
                    help="extra argument for `cairn serve` (repeatable)")
    ap.add_argument("--json", help="also write all numbers here")
    args = ap.parse_args()
    parts = [p for p in args.parts.split(",") if p]

    b = Bench(args)
    out = {}
    try:
        if "ttft" in parts:
            out["ttft"] = b.run_ttft()
        if "resume" in parts:
            out["resume"] = b.run_resume()
    finally:
        b.close()
    print(f"\nmodel {os.path.basename(args.model)}, {os.cpu_count()} CPUs")
    report(args, out)
    if args.json:
        for k in ("ttft",):
            if k in out:
                for s in out[k]["phases"].values():
                    s.pop("tokens", None)
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": out}, f, indent=2, default=str)


if __name__ == "__main__":
    main()
