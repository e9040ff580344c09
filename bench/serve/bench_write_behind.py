#!/usr/bin/env python3
"""What write-behind costs (issue 36): `cairn serve --cache-dir` with the
default write-behind of reused prefixes against `--no-write-behind`, on the
same machine in the same run, alternating, each on a fresh cache directory.

Documents of ~1.5k tokens, greedy, streamed over the OpenAI-compatible HTTP
API; a reuse (document + another question) is what queues a document's
pages for write-behind (about 17 MB a document on the 0.5B model):
  prefill phase, D documents: cold (document d + question 1, 1 token) right
          after the 1-token reuse of document d-1, so its prefill runs while
          d-1's pages are written behind; prefill tokens/s of the cold ones;
  decode phase, D other documents: cold, then the reuse with N tokens (end
          of text suppressed), whose decode runs while the document's pages
          are written; decode tokens/s over its first 16 tokens (while the
          write-behind runs) and over all N.
Then it waits until the write-behind has committed (polls /metrics), SIGKILLs
the server, restarts it on the same directory and sends the first document
of the decode phase + question 1 again: what the write-behind buys.

Both servers are up at once and every measured step runs on one, then the
same step on the other (each lets its write-behind finish before the other
goes on), so that the load of a shared machine is nearly the same for both;
the first side alternates between rounds. Reported: medians over documents
and rounds, and the median of the per-step on/off ratios. This is a
measurement script, not a test.

usage: bench/serve/bench_write_behind.py [--bin build/cairn]
         [--model models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf]
         [--docs 4] [--decode 64] [--rounds 2] [--threads N] [--json out.json]
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
from cairn_client.launch import ServerProcess  # noqa: E402

TOPICS = ["scheduler", "page pool", "radix tree", "disk tier", "tokenizer", "sampler",
          "HTTP facade", "session table", "cost model", "copy queue", "router", "grammar"]
VERBS = ["admits", "evicts", "verifies", "batches", "streams", "promotes", "records", "splits"]
THINGS = ["requests", "pages", "prefixes", "tokens", "sessions", "events", "records", "replies"]


def document(d, n_paragraphs=26):
    """Document d: ~60 tokens a paragraph, distinct from the first token on."""
    out = ["Manual %d." % d]
    for i in range(n_paragraphs):
        t, v, w = (TOPICS[(i + d) % len(TOPICS)], VERBS[(i * 3 + d) % len(VERBS)],
                   THINGS[(i * 5 + d) % len(THINGS)])
        out.append("Section %d. The %s %s %s in order %d; when a step of %d ms ends, it "
                   "checks the %s of queue %d and writes a note to log file %d, unless the "
                   "operator set flag %s-%d to off." % (i + 1, t, v, w, (i * 7 + d) % 13,
                                                     10 + i + d, THINGS[i % len(THINGS)],
                                                     i % 5, i + d, t.split()[0], i))
    return "\n".join(out)


Q1 = "\n\nQuestion: What does the scheduler do in section 1?\nAnswer:"
Q2 = "\n\nQuestion: Summarise sections 2 to 5 in detail.\nAnswer:"


def stream(srv, prompt, n):
    """One streamed greedy completion: (ttft_s, decode tokens/s or None,
    usage)."""
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True},
            "logit_bias": {"151643": -100, "151645": -100}}  # decode exactly n tokens
    req = urllib.request.Request(srv.http_url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    first = last = None
    times = []
    chunks = 0
    usage = None
    with urllib.request.urlopen(req, timeout=600) as f:
        for line in f:
            line = line.decode().strip()
            if not line.startswith("data: {"):
                continue
            obj = json.loads(line[6:])
            if obj.get("usage"):
                usage = obj["usage"]
            if obj.get("choices"):
                now = time.perf_counter()
                times.append(now)
                if first is None:
                    first = now
                last = now
                chunks += 1
    ttft = (first or time.perf_counter()) - t0
    n_out = usage["completion_tokens"] if usage else chunks
    rate = (n_out - 1) / (last - first) if n_out > 1 and last > first else None
    # the first 16 tokens (one chunk a token while streaming; the usage
    # chunk carries no choices)
    early = (15 / (times[15] - times[0])) if len(times) > 16 and times[15] > times[0] else None
    return ttft, (rate, early), usage


def metrics(srv):
    with urllib.request.urlopen(srv.http_url + "/metrics", timeout=60) as f:
        out = {}
        for line in f.read().decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out


def wait_written(srv, guard=300):
    """Until the write-behind has nothing waiting or in flight; seconds."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < guard:
        m = metrics(srv)
        if (m.get("cairn_kv_write_behind_waiting", 0) == 0 and
                m.get("cairn_kv_write_behind_pages_total", 0) ==
                m.get("cairn_kv_write_behind_queued_pages_total", 0)):
            return time.perf_counter() - t0, m
        time.sleep(0.05)
    raise RuntimeError("write-behind did not finish")


class Side:
    """One server: write-behind on (default) or off, on a fresh directory."""

    def __init__(self, args, mode):
        self.mode = mode
        self.tmp = tempfile.mkdtemp(prefix="cairn-wb-bench-")
        extra = ["--no-write-behind"] if mode == "off" else []
        self.srv_args = ["-m", args.model, "-c", "2048", "--kv-mem", "512M", "--cache-dir",
                         os.path.join(self.tmp, "kv"), *extra]
        if args.threads:
            self.srv_args += ["-t", str(args.threads)]
        self.start()
        stream(self.srv, "Warm-up: say hi.", 4)
        self.r = {"prefill": [], "decode": [], "decode16": []}

    def start(self):
        self.srv = ServerProcess(ARGS.bin, self.srv_args, tcp=False, http=True,
                                 start_timeout=300)

    def settle(self):
        """Let the write-behind finish before the other side runs (it would
        otherwise take CPU from the other side's measurement)."""
        return wait_written(self.srv)

    def close(self):
        if self.srv.alive():
            self.srv.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)


def run_round(args, first):
    """Both servers up; every measured step runs on one side, then the
    same step on the other, so that the machine's load (shared, noisy) is
    nearly the same for both. `first` runs first in each pair."""
    sides = {m: None for m in ("on", "off")}
    try:
        for m in sides:
            sides[m] = Side(args, m)
        order = [sides[first], sides["off" if first == "on" else "on"]]
        for d in range(args.docs):  # prefill while the previous document is written
            for sd in order:
                if d:
                    stream(sd.srv, document(d - 1) + Q2, 1)  # the reuse
                ttft, _, u = stream(sd.srv, document(d) + Q1, 1)
                sd.r["prefill"].append(
                    (u["prompt_tokens"] - u["prompt_tokens_details"]["cached_tokens"]) / ttft)
                sd.settle()
        for d in range(100, 100 + args.docs):  # decode while the document is written
            for sd in order:
                stream(sd.srv, document(d) + Q1, 1)
                _, (rate, early), u = stream(sd.srv, document(d) + Q2, args.decode)
                sd.r["decode"].append(rate)
                sd.r["decode16"].append(early)
                sd.settle()
        out = {}
        for m, sd in sides.items():
            _, mm = sd.settle()
            written = mm.get("cairn_kv_write_behind_pages_total", 0)
            engine_s = mm.get("cairn_kv_write_behind_engine_seconds_total", 0)
            sd.srv.kill()  # SIGKILL, then a reused document again
            sd.start()
            ttft, _, u = stream(sd.srv, document(100) + Q1, 1)
            sd.srv.stop()
            out[m] = dict(sd.r, written_pages=written,
                          engine_us_per_page=1e6 * engine_s / written if written else 0,
                          ttft_restart=ttft,
                          cached_restart=u["prompt_tokens_details"]["cached_tokens"],
                          prompt_restart=u["prompt_tokens"])
        return out
    finally:
        for sd in sides.values():
            if sd:
                sd.close()


ARGS = None


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "cairn"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models",
                                                    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
    ap.add_argument("--docs", type=int, default=3)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json")
    args = ARGS = ap.parse_args()
    results = {"on": [], "off": []}
    for r in range(args.rounds):
        res = run_round(args, "on" if r % 2 == 0 else "off")
        for mode in ("on", "off"):
            x = res[mode]
            results[mode].append(x)
            print("round %d %-3s prefill %s tok/s, decode %s (first 16: %s) tok/s, written %d "
                  "pages, restart TTFT %.2f s (cached %d/%d)" % (
                      r, mode, " ".join("%.0f" % v for v in x["prefill"]),
                      " ".join("%.1f" % v for v in x["decode"]),
                      " ".join("%.1f" % v for v in x["decode16"]),
                      x["written_pages"], x["ttft_restart"], x["cached_restart"],
                      x["prompt_restart"]), flush=True)

    def values(mode, key):
        return [v for res in results[mode] for v in (res[key] if isinstance(res[key], list)
                                                      else [res[key]])]

    rows = [("prefill, cold document (tokens/s)", "prefill", "%.0f", True),
            ("decode, first 16 tokens, during write-behind (tokens/s)", "decode16", "%.2f", True),
            ("decode, all tokens (tokens/s)", "decode", "%.2f", True),
            ("TTFT after SIGKILL + restart (s)", "ttft_restart", "%.2f", False),
            ("cached tokens after SIGKILL + restart", "cached_restart", "%.0f", False),
            ("pages written behind", "written_pages", "%.0f", False),
            ("engine-thread time per page written (us)", "engine_us_per_page", "%.0f", False)]
    print()
    print("| | write-behind on | off (`--no-write-behind`) | on / off |")
    print("|---|---|---|---|")
    for name, key, fmt, paired in rows:
        on, off = values("on", key), values("off", key)
        mon, moff = statistics.median(on), statistics.median(off)
        if paired:  # the median of the per-step ratios (each pair ran back to back)
            ratio = "%.3f" % statistics.median(a / b for a, b in zip(on, off) if a and b)
        else:
            ratio = "%.3f" % (mon / moff) if moff else "-"
        print("| %s | %s | %s | %s |" % (name, fmt % mon, fmt % moff, ratio))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
