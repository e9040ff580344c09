#!/usr/bin/env python3
"""Speculative decoding, side by side: cairn with each --spec method against
plain cairn, and llama-server plain, with its n-gram speculation types and
with a draft model, on the chat workloads of workloads.py (RAG answer
quoting its document, code edit, agent turn after tool results, free story).

Every request goes to /v1/chat/completions, greedy (temperature 0, a fixed
seed), max_tokens -n. It is streamed by default, so the client measures the
time to the first content token (TTFT) and the decode rate after it:
(completion_tokens - 1) / (end - first token). --no-stream sends
stream=false instead and rates whole requests (wall time, prompt included).

In each of -r rounds every server config starts fresh, answers one warm-up
request, runs every workload once and is stopped; the order of the configs
rotates from round to round. So each measured prompt is computed cold (no
prefix cache from an earlier round), only one model is in memory at a time,
and drift in the machine's load spreads over every config.

Speculation must not change what greedy decoding says: every cairn --spec
output is compared with plain cairn's for the same workload (text, tool
calls, finish reason and completion token count), and the run exits 1 if one
differs. llama-server's rows are compared with plain llama-server the same
way, for information only.

Configs whose pieces are missing are skipped with the reason: a method whose
file was not given or does not exist, a cairn without --spec, a server that
exits at start (an option or method value it does not know: its last log
lines are printed).

tau is tokens per target forward, from usage.speculative when cairn reports
it; for llama-server it is derived from timings (predicted_n / (predicted_n -
draft_n_accepted): each verification step yields its accepted drafts plus
one token).

usage: bench/spec/bench_spec.py [--cairn build/cairn] [--llama-server PATH]
           [--model M.gguf] [--draft-model D.gguf] [--eagle-head H.gguf]
           [--medusa-heads H.gguf] [--methods ngram,draft,eagle,medusa]
           [--llama-methods ngram-simple,ngram-map-k,ngram-mod,draft]
           [--workloads rag,code,agent,story] [-n 160] [-r 3] [--threads 2]
           [--port-base 18300] [--json out.json]
"""
import argparse
import ctypes
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
from workloads import WARMUP, WORKLOADS  # noqa: E402

CAIRN_METHODS = ("ngram", "draft", "eagle", "medusa")
LLAMA_NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")


def short_name(path):
    base = os.path.basename(path)
    return base[:-5] if base.endswith(".gguf") else base


class Config:
    """One server to measure: engine, method label, its command line (with
    {port} for the HTTP port), or the reason it is skipped."""

    def __init__(self, engine, method, argv=None, skip=None):
        self.engine, self.method, self.argv, self.skip = engine, method, argv, skip

    @property
    def label(self):
        return "%s %s" % (self.engine, self.method)

    @property
    def plain(self):
        return self.method == "plain"


# ---------------------------------------------------------------- configs

def cairn_help(cairn):
    try:
        r = subprocess.run([cairn, "serve", "--help"], capture_output=True, text=True, timeout=30)
        return r.stdout + r.stderr
    except OSError as e:
        return "cannot run %s: %s" % (cairn, e)


def cairn_configs(args):
    base = [args.cairn, "serve", "-m", args.model, "-t", str(args.threads), "-c", str(args.ctx),
            "--port", "0", "--http-port", "{port}", "--max-seqs", "2",
            "--model-name", short_name(args.model)]
    configs = [Config("cairn", "plain", base)]
    helptext = cairn_help(args.cairn)
    has_spec = "--spec" in helptext
    files = {"draft": args.draft_model, "eagle": args.eagle_head, "medusa": args.medusa_heads}
    flag_of = {"draft": "--draft-model", "eagle": "--eagle-head", "medusa": "--medusa-heads"}
    for entry in args.methods:
        # "ngram+draft" asks for both at once: --spec ngram,draft:D.gguf
        parts, values, skip = entry.split("+"), [], None
        for m in parts:
            if m not in CAIRN_METHODS:
                skip = "unknown method '%s' (known: %s)" % (m, ", ".join(CAIRN_METHODS))
                break
            if m == "ngram":
                values.append("ngram")
                continue
            path = files[m]
            if not path:
                skip = "no %s given" % flag_of[m]
                break
            if not os.path.exists(path):
                skip = "%s %s does not exist" % (flag_of[m], path)
                break
            if m == "draft" and os.path.realpath(path) == os.path.realpath(args.model):
                skip = "the draft model is the target model itself"
                break
            values.append("%s:%s" % (m, path))
        label = "+".join("%s:%s" % (m, short_name(files[m])) if m != "ngram" else m
                         for m in parts) if skip is None else entry
        if skip is None and not has_spec:
            if parts == ["eagle"] and "--draft " in helptext:
                # before --spec, an EAGLE head was given with --draft
                configs.append(Config("cairn", label, base + ["--draft", files["eagle"]]))
                continue
            skip = "this cairn serve has no --spec option (yet)"
        configs.append(Config("cairn", label, base + ["--spec", ",".join(values)] if skip is None
                              else None, skip))
    return configs


def llama_configs(args):
    if not args.llama_server:
        return []
    if not os.path.exists(args.llama_server):
        return [Config("llama.cpp", "plain", skip="%s does not exist" % args.llama_server)]
    base = [args.llama_server, "-m", args.model, "--host", "127.0.0.1", "--port", "{port}",
            "-t", str(args.threads), "-tb", str(args.threads), "-c", str(args.ctx), "-np", "1",
            "--jinja", "--alias", short_name(args.model)]
    configs = [Config("llama.cpp", "plain", base)]
    for entry in args.llama_methods:
        if entry in LLAMA_NGRAM_TYPES:
            configs.append(Config("llama.cpp", entry, base + ["--spec-type", entry]))
        elif entry == "draft":
            d = args.draft_model
            label = "draft:%s" % short_name(d) if d else "draft"
            if not d or not os.path.exists(d):
                configs.append(Config("llama.cpp", label, skip="no draft model %s" % (d or "given")))
            elif os.path.realpath(d) == os.path.realpath(args.model):
                configs.append(Config("llama.cpp", label,
                                      skip="the draft model is the target model itself"))
            else:
                extra = ["--spec-type", "draft-simple", "--model-draft", d,
                         "-td", str(args.threads), "-tbd", str(args.threads)]
                if args.llama_draft_max:
                    extra += ["--spec-draft-n-max", str(args.llama_draft_max)]
                configs.append(Config("llama.cpp", label, base + extra))
        else:
            configs.append(Config("llama.cpp", entry, skip="unknown llama method '%s' (known: %s, "
                                  "draft)" % (entry, ", ".join(LLAMA_NGRAM_TYPES))))
    return configs


# ---------------------------------------------------------------- servers

def die_with_parent():
    """In the child: get SIGTERM when this script dies, however it dies, so
    no server outlives a run and holds its port."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Server:
    """A server process on 127.0.0.1:port, ready once /v1/models answers 200
    (llama-server answers 503 while it loads)."""

    def __init__(self, config, port, timeout, logdir):
        self.port = port
        self.log_path = os.path.join(logdir, "%s-%s.log" % (config.engine,
                                                            config.method.replace("/", "_")))
        argv = [a.replace("{port}", str(port)) for a in config.argv]
        # Something already answering there (a server left by a killed run)
        # would be measured instead of ours.
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                raise RuntimeError("port %d is already in use (a stale server?)" % port)
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
        deadline = time.time() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("exited with status %d at start:\n%s"
                                   % (self.proc.returncode, self.log_tail()))
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/v1/models")
                status = c.getresponse().status
                c.close()
                if status == 200:
                    return
            except OSError:
                pass
            if time.time() > deadline:
                self.stop()
                raise RuntimeError("not ready after %d s:\n%s" % (timeout, self.log_tail()))
            time.sleep(0.25)

    def log_tail(self, n=8):
        self.log.flush()
        with open(self.log_path, "rb") as f:
            lines = f.read().decode("utf-8", "replace").splitlines()
        return "\n".join("    " + l for l in lines[-n:])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


# ---------------------------------------------------------------- requests

def chat(port, body, stream, timeout):
    """One chat completion. Returns a dict: ttft (s, None unstreamed), wall
    (s), text (content plus tool calls, what the identity check compares),
    finish, usage, timings (llama-server's, if any)."""
    body = dict(body, stream=stream)
    if stream:
        body["stream_options"] = {"include_usage": True}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError("HTTP %d: %s" % (resp.status, resp.read()[:500].decode("utf-8", "replace")))
    out = {"ttft": None, "usage": None, "timings": None, "finish": None}
    content, calls = [], {}
    if not stream:
        r = json.loads(resp.read())
        out["wall"] = time.perf_counter() - t0
        msg = r["choices"][0]["message"]
        content.append(msg.get("content") or "")
        for i, tc in enumerate(msg.get("tool_calls") or []):
            calls[i] = [tc["function"]["name"], tc["function"].get("arguments") or ""]
        out["finish"] = r["choices"][0].get("finish_reason")
        out["usage"], out["timings"] = r.get("usage"), r.get("timings")
    else:
        for raw in resp:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                out["usage"] = chunk["usage"]
            if chunk.get("timings"):
                out["timings"] = chunk["timings"]
            for ch in chunk.get("choices") or []:
                delta = ch.get("delta") or {}
                got = False
                if delta.get("content"):
                    content.append(delta["content"])
                    got = True
                for tc in delta.get("tool_calls") or []:
                    slot = calls.setdefault(tc.get("index", 0), ["", ""])
                    fn = tc.get("function") or {}
                    slot[0] += fn.get("name") or ""
                    slot[1] += fn.get("arguments") or ""
                    got = True
                if got and out["ttft"] is None:
                    out["ttft"] = time.perf_counter() - t0
                if ch.get("finish_reason"):
                    out["finish"] = ch["finish_reason"]
        out["wall"] = time.perf_counter() - t0
    conn.close()
    text = "".join(content)
    for i in sorted(calls):
        text += "\n<tool_call %s %s>" % tuple(calls[i])
    out["text"] = text
    return out


def request_body(workload, args, max_tokens):
    body = {"model": short_name(args.model), "messages": workload["messages"],
            "max_tokens": max_tokens, "temperature": 0, "seed": args.seed}
    if workload.get("tools"):
        body["tools"] = workload["tools"]
    return body


def measure(port, workload, args):
    r = chat(port, request_body(workload, args, args.n_predict), not args.no_stream,
             args.request_timeout)
    usage = r["usage"] or {}
    n = usage.get("completion_tokens")
    r["tokens"] = n
    r["prompt_tokens"] = usage.get("prompt_tokens")
    if n and r["ttft"] is not None and r["wall"] > r["ttft"] and n > 1:
        r["decode_tps"] = (n - 1) / (r["wall"] - r["ttft"])
    else:
        r["decode_tps"] = None
    r["e2e_tps"] = n / r["wall"] if n else None
    r["tau"] = r["accept"] = None
    spec = usage.get("speculative")
    if isinstance(spec, dict):
        r["spec"] = spec
        r["tau"] = spec.get("tau")
        if spec.get("drafted"):
            r["accept"] = spec.get("accepted", 0) / spec["drafted"]
    t = r["timings"] or {}
    if t.get("draft_n"):
        pn, acc = t.get("predicted_n") or n or 0, t.get("draft_n_accepted", 0)
        r["accept"] = acc / t["draft_n"]
        if pn > acc:
            r["tau"] = pn / (pn - acc)
    return r


# ---------------------------------------------------------------- run

def run(args, configs, workloads):
    """results[label][workload] = list of measurements, one per round."""
    results = {c.label: {w: [] for w in workloads} for c in configs}
    live = [c for c in configs if c.skip is None]
    logdir = tempfile.mkdtemp(prefix="bench-spec-")
    print("server logs in %s" % logdir, file=sys.stderr)
    try:
        run_rounds(args, configs, workloads, results, live, logdir)
    except KeyboardInterrupt:
        # the server in use was stopped on the way out; report what finished
        args.interrupted = True
        print("interrupted: reporting the measurements so far", file=sys.stderr)
    return results


def run_rounds(args, configs, workloads, results, live, logdir):
    for rnd in range(args.rounds):
        k = rnd % len(live) if live else 0
        for c in live[k:] + live[:k]:
            if c.skip:
                continue
            port = args.port_base + configs.index(c)
            t = time.time()
            try:
                srv = Server(c, port, args.start_timeout, logdir)
            except RuntimeError as e:
                c.skip = "server did not start: %s" % e
                print("skip %s: %s" % (c.label, c.skip), file=sys.stderr)
                continue
            try:
                chat(port, dict(request_body(WARMUP, args, 16)), False, args.request_timeout)
                for w in workloads:
                    m = measure(port, WORKLOADS[w], args)
                    results[c.label][w].append(m)
                    print("round %d  %-40s %-6s %5s+%4s tok  ttft %s  %s tok/s  tau %s" % (
                        rnd + 1, c.label, w, m["prompt_tokens"], m["tokens"], fmt(m["ttft"], "%.2f"),
                        fmt(m["decode_tps"] if m["decode_tps"] is not None else m["e2e_tps"],
                            "%.2f"), fmt(m["tau"], "%.2f")), file=sys.stderr)
            except (RuntimeError, OSError, ValueError, KeyError) as e:
                c.skip = "request failed: %s\n%s" % (e, srv.log_tail())
                print("skip %s: %s" % (c.label, c.skip), file=sys.stderr)
            finally:
                srv.stop()
            print("round %d  %s took %.0f s" % (rnd + 1, c.label, time.time() - t),
                  file=sys.stderr)


def fmt(x, f):
    return "-" if x is None else f % x


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def first_difference(a, b):
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def same_output(m, ref):
    return (m["text"] == ref["text"] and m["finish"] == ref["finish"]
            and m["tokens"] == ref["tokens"])


def report(args, configs, workloads, results):
    rate = "tok/s" if args.no_stream else "decode tok/s"
    print("\n%s, %d new tokens at most, greedy, %d thread(s), %d round(s)%s; load average "
          "%.1f at the start, %.1f at the end (%d CPUs)\n" % (
              short_name(args.model), args.n_predict, args.threads, args.rounds,
              "" if args.no_stream else ", streamed", args.load_start, os.getloadavg()[0],
              os.cpu_count()))
    if args.interrupted:
        print("(interrupted: cells are medians over the rounds that finished)\n")
    print("| workload | model | engine | method | prompt | tokens | TTFT s | %s | e2e tok/s | tau | "
          "accept | speed-up vs cairn | vs llama.cpp | same output |" % rate)
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    lossless_failures, notes = [], []
    live = [c for c in configs if c.skip is None and any(results[c.label][w] for w in workloads)]
    for w in workloads:
        summary = {}
        for c in live:
            ms = results[c.label][w]
            if not ms:
                continue
            summary[c.label] = {
                "prompt": median([m["prompt_tokens"] for m in ms]),
                "tokens": median([m["tokens"] for m in ms]),
                "ttft": median([m["ttft"] for m in ms]),
                "rate": median([m["e2e_tps"] if args.no_stream else m["decode_tps"] for m in ms]),
                "e2e": median([m["e2e_tps"] for m in ms]),
                "tau": median([m["tau"] for m in ms]),
                "accept": median([m["accept"] for m in ms]),
            }
        ref_cairn = summary.get("cairn plain", {}).get("rate")
        ref_llama = summary.get("llama.cpp plain", {}).get("rate")
        for c in live:
            s = summary.get(c.label)
            if not s:
                continue
            ms = results[c.label][w]
            plain = results.get("%s plain" % c.engine, {}).get(w) or []
            if c.plain:
                same = "reference" if all(same_output(m, ms[0]) for m in ms) else \
                    "NO: differs between rounds"
                if c.engine == "cairn" and same != "reference":
                    notes.append("plain cairn's %s output differs between rounds" % w)
            elif not plain:
                same = "-"
            else:
                bad = [m for m in ms if not same_output(m, plain[0])]
                same = "yes" if not bad else "NO (%d/%d)" % (len(bad), len(ms))
                if bad:
                    k = first_difference(bad[0]["text"], plain[0]["text"])
                    msg = ("%s on %s: output differs from plain %s from character %d: "
                           "%r vs %r (tokens %s vs %s, finish %s vs %s)" % (
                               c.label, w, c.engine, k, bad[0]["text"][k:k + 40],
                               plain[0]["text"][k:k + 40], bad[0]["tokens"], plain[0]["tokens"],
                               bad[0]["finish"], plain[0]["finish"]))
                    if c.engine == "cairn":
                        lossless_failures.append(msg)
                    else:
                        notes.append(msg)
            vs_cairn = s["rate"] / ref_cairn if s["rate"] and ref_cairn else None
            vs_llama = s["rate"] / ref_llama if s["rate"] and ref_llama and \
                c.engine == "llama.cpp" else None
            print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                w, short_name(args.model), c.engine, c.method, fmt(s["prompt"], "%d"),
                fmt(s["tokens"], "%d"),
                fmt(s["ttft"], "%.2f"), fmt(s["rate"], "%.2f"), fmt(s["e2e"], "%.2f"),
                fmt(s["tau"], "%.2f"), fmt(s["accept"], "%.2f"), fmt(vs_cairn, "%.2fx"),
                fmt(vs_llama, "%.2fx"), same))
    print()
    if "cairn plain" in results and "llama.cpp plain" in results:
        for w in workloads:
            a, b = results["cairn plain"].get(w), results["llama.cpp plain"].get(w)
            if a and b:
                print("- %s: plain cairn and plain llama.cpp %s" % (
                    w, "say the same" if a[0]["text"] == b[0]["text"] else
                    "differ from character %d" % first_difference(a[0]["text"], b[0]["text"])))
    for c in configs:
        if c.skip:
            print("- skipped %s: %s" % (c.label, c.skip.replace("\n", "\n  ")))
    for n in notes:
        print("- note: %s" % n)
    for f in lossless_failures:
        print("- LOSSLESS CHECK FAILED: %s" % f)
    if not any(c.engine == "cairn" and not c.plain and c.skip is None for c in configs):
        print("- no cairn speculative config ran, so nothing was checked for losslessness")
    return lossless_failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cairn", default=os.path.join(ROOT, "build", "cairn"))
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER"),
                    help="llama-server binary to compare with (default $LLAMA_SERVER; "
                         "none: cairn only)")
    ap.add_argument("--model", default=os.path.join(
        ROOT, "models", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"), help="the target model")
    ap.add_argument("--draft-model", default=os.path.join(
        ROOT, "models", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
        help="a smaller model of the same vocabulary (cairn draft:, llama.cpp --model-draft)")
    ap.add_argument("--eagle-head", help="EAGLE head GGUF for the target (cairn eagle:)")
    ap.add_argument("--medusa-heads", help="Medusa heads GGUF for the target (cairn medusa:)")
    ap.add_argument("--methods", default=",".join(CAIRN_METHODS),
                    help="cairn --spec methods, comma-separated; join with + to combine "
                         "(ngram+draft) (default %(default)s; 'none' for plain only)")
    ap.add_argument("--llama-methods", default="ngram-simple,ngram-map-k,ngram-mod,draft",
                    help="llama-server --spec-type values and/or 'draft' (--model-draft) "
                         "(default %(default)s; 'none' for plain only)")
    ap.add_argument("--llama-draft-max", type=int,
                    help="llama-server --spec-draft-n-max (default: llama.cpp's own)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS),
                    help="comma-separated, of %s" % ", ".join(WORKLOADS))
    ap.add_argument("-n", "--n-predict", type=int, default=160, help="max_tokens per request")
    ap.add_argument("-r", "--rounds", type=int, default=3, help="rounds (each config runs "
                    "each workload once per round)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx", type=int, default=4096, help="context of every server")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--no-stream", action="store_true",
                    help="stream=false: rate whole requests, no TTFT")
    ap.add_argument("--port-base", type=int, default=18300,
                    help="config i listens on port-base + i")
    ap.add_argument("--start-timeout", type=float, default=300)
    ap.add_argument("--request-timeout", type=float, default=1800)
    ap.add_argument("--json", help="write every measurement here")
    args = ap.parse_args()

    def listed(s):
        return [] if s.strip() in ("", "none") else [x.strip() for x in s.split(",") if x.strip()]

    args.methods, args.llama_methods = listed(args.methods), listed(args.llama_methods)
    workloads = listed(args.workloads)
    for w in workloads:
        if w not in WORKLOADS:
            ap.error("unknown workload '%s' (known: %s)" % (w, ", ".join(WORKLOADS)))
    if not os.path.exists(args.model):
        ap.error("model %s does not exist (scripts/get-model %s)" % (args.model,
                                                                    short_name(args.model)))
    if not os.path.exists(args.cairn):
        ap.error("%s does not exist (build cairn first)" % args.cairn)

    configs = cairn_configs(args) + llama_configs(args)
    for c in configs:
        print("%-45s %s" % (c.label, ("SKIP: " + c.skip) if c.skip else " ".join(c.argv)),
              file=sys.stderr)
    # A busy machine slows every config, llama.cpp's spinning thread pool
    # most: the load is printed with the table so a reader can judge it.
    args.load_start = os.getloadavg()[0]
    args.interrupted = False
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    results = run(args, configs, workloads)
    failures = report(args, configs, workloads, results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items()},
                       "skipped": {c.label: c.skip for c in configs if c.skip},
                       "results": results}, f, indent=1)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
