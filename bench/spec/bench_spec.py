#!/usr/bin/env python3
"""Speculative decoding, side by side: cairn with each --spec method against
plain cairn, and llama-server plain, with its n-gram speculation types and
with a draft model, on the chat workloads of workloads.py (RAG answer
quoting its document, code edit, a 10-turn agent loop of JSON tool calls,
one task sent as 4 fresh sessions, free story).

Every request goes to /v1/chat/completions, greedy (temperature 0, a fixed
seed), max_tokens -n per request. It is streamed by default, so the client
measures the time to the first content token (TTFT) and the decode rate
after it: (completion_tokens - 1) / (end - first token). --no-stream sends
stream=false instead and rates whole requests (wall time, prompt included).

Multi-request workloads sum over their requests: decode tok/s =
sum(completion_tokens - 1) / sum(decode seconds), tau and accept from the
summed counts. agent_loop: each of its 10 turns resends the whole history
with the assistant's last tool call and the tool's result (workloads.py
computes it from the call), as an agent framework does; the loop ends early
when a reply has no tool call. A server holds back a streamed reply that may
be a tool call (cairn sends it whole at the end), so each turn is measured
in three requests: the turn with max_tokens 1 (computes the new prompt: the
turn's TTFT), again (the prompt now cached: t1, one step), then the turn
itself; its decode seconds are its wall time - t1. repeat4: the same prompt
as 4 separate conversations (4 plain requests, nothing ties them together).

In each of -r rounds every server config starts fresh, answers one warm-up
request, runs every workload once and is stopped; the order of the configs
rotates from round to round. So each measured prompt is computed cold (no
prefix cache from an earlier round), only one model is in memory at a time,
and drift in the machine's load spreads over every config.

Speculation must not change what greedy decoding says: every cairn --spec
output is compared with plain cairn's for the same workload (every request's
text, tool calls, finish reason and completion token count), and the run
exits 1 if one differs. llama-server's rows are compared with plain
llama-server the same way, for information only.

Methods are passed through by name: cairn's as `--spec NAME` (suffix, ngram,
...; draft, eagle, medusa, eagle3 get their file from the options unless
written NAME:FILE; `+` combines: suffix+draft is --spec suffix,draft:D.gguf),
llama.cpp's as `--spec-type NAME` (draft is draft-simple with --model-draft).
Configs whose pieces are missing are skipped with the reason: a method whose
file was not given or does not exist, a cairn without --spec, a server that
exits at start (an option or method value it does not know: its last log
lines are printed).

tau is tokens per target forward, from usage.speculative when cairn reports
it; for llama-server it is derived from timings (predicted_n / (predicted_n -
draft_n_accepted): each verification step yields its accepted drafts plus
one token).

After the per-config table comes a summary per workload: plain cairn, each
cairn method's speed-up, llama.cpp plain and its best, and the goals of
issue 35 (>= 1.5x plain cairn on code and rag, >= 2x on agent_loop and
repeat4, no method below 0.97x on story, cairn's best ahead of llama.cpp's
best everywhere). The header names the CPU, its ISA and the load average.

usage: bench/spec/bench_spec.py [--cairn build/cairn] [--llama-server PATH]
           [--model M.gguf] [--draft-model D.gguf|none] [--eagle-head H.gguf]
           [--medusa-heads H.gguf] [--methods suffix,draft,suffix+draft]
           [--llama-methods ngram-mod,ngram-map-k,draft]
           [--workloads rag,code,agent_loop,repeat4,story] [-n 160] [-r 3]
           [--threads 2] [--port-base 18300] [--json out.json]
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
from workloads import WARMUP, WORKLOADS, agent_tool_result  # noqa: E402

DEFAULT_CAIRN_METHODS = "suffix,draft,suffix+draft"
DEFAULT_LLAMA_METHODS = "ngram-mod,ngram-map-k,draft"
# speed-up over plain cairn that issue 35 asks of the best method per workload
# (story: of every method, it is the "never slower" check)
GOALS = {"code": 1.5, "rag": 1.5, "agent_loop": 2.0, "repeat4": 2.0, "story": 0.97}


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
    # methods that need a file: where it comes from when the entry names none
    files = {"draft": ("--draft-model", args.draft_model),
             "eagle": ("--eagle-head", args.eagle_head),
             "eagle3": ("--eagle-head", args.eagle_head),
             "medusa": ("--medusa-heads", args.medusa_heads)}
    for entry in args.methods:
        # any name goes through as --spec NAME; "suffix+draft" asks for both
        # at once: --spec suffix,draft:D.gguf. The server judges the names.
        values, labels, skip = [], [], None
        for part in entry.split("+"):
            name, _, value = part.partition(":")
            if name in files:
                flag, path = files[name]
                if not value:
                    if not path:
                        skip = "no %s given" % flag
                        break
                    value = path
                if not os.path.exists(value):
                    skip = "%s file %s does not exist" % (name, value)
                    break
                if name == "draft" and os.path.realpath(value) == os.path.realpath(args.model):
                    skip = "the draft model is the target model itself"
                    break
            values.append(name + (":" + value if value else ""))
            labels.append(name + (":" + short_name(value) if value else ""))
        label = "+".join(labels) if skip is None else entry
        if skip is None and not has_spec:
            if entry == "eagle" and "--draft " in helptext:
                # before --spec, an EAGLE head was given with --draft
                configs.append(Config("cairn", label, base + ["--draft", files["eagle"][1]]))
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
        # any --spec-type value goes through (llama-server refuses one it
        # does not know at start: skipped); "draft" is draft-simple with
        # --model-draft; "+" combines (ngram-mod+draft)
        types, extra, label, skip = [], [], [], None
        for part in entry.split("+"):
            if part not in ("draft", "draft-simple"):
                types.append(part)
                label.append(part)
                continue
            d = args.draft_model
            label.append("draft:%s" % short_name(d) if d else "draft")
            if not d or not os.path.exists(d):
                skip = "no draft model %s" % (d or "given")
            elif os.path.realpath(d) == os.path.realpath(args.model):
                skip = "the draft model is the target model itself"
            types.append("draft-simple")
            extra += ["--model-draft", d or "", "-td", str(args.threads),
                      "-tbd", str(args.threads)]
            if args.llama_draft_max:
                extra += ["--spec-draft-n-max", str(args.llama_draft_max)]
        configs.append(Config("llama.cpp", "+".join(label),
                              None if skip else base + ["--spec-type", ",".join(types)] + extra,
                              skip))
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
    out["content"] = text
    out["calls"] = [tuple(calls[i]) for i in sorted(calls)]
    for i in sorted(calls):
        text += "\n<tool_call %s %s>" % tuple(calls[i])
    out["text"] = text
    return out


def request_body(workload, args, max_tokens, messages=None):
    body = {"model": short_name(args.model), "messages": messages or workload["messages"],
            "max_tokens": max_tokens, "temperature": 0, "seed": args.seed}
    for k in ("tools", "tool_choice", "parallel_tool_calls"):
        if k in workload:
            body[k] = workload[k]
    return body


def measure(port, body, args, primed=False):
    """One request, measured. primed: first send it with max_tokens 1 twice
    (the first computes the prompt, its wall time is the TTFT; the second
    finds it cached: t1), then the request itself, whose decode seconds are
    its wall time - t1. For replies a server holds back until the end (tool
    calls), where the first streamed token comes too late to time."""
    stream = not args.no_stream
    t1 = ttft = None
    if primed:
        ttft = chat(port, dict(body, max_tokens=1), False, args.request_timeout)["wall"]
        t1 = chat(port, dict(body, max_tokens=1), False, args.request_timeout)["wall"]
    r = chat(port, body, stream, args.request_timeout)
    usage = r["usage"] or {}
    n = usage.get("completion_tokens")
    r["tokens"] = n
    r["prompt_tokens"] = usage.get("prompt_tokens")
    r["decode_s"] = None
    if primed:
        r["ttft"] = ttft
        if stream and r["wall"] > t1:
            r["decode_s"] = r["wall"] - t1
    elif r["ttft"] is not None and r["wall"] > r["ttft"]:
        r["decode_s"] = r["wall"] - r["ttft"]
    r["spec"] = usage.get("speculative") if isinstance(usage.get("speculative"), dict) else None
    return r


def client_tool_calls(content, tools):
    """The call an agent framework would still take from a reply the server
    did not parse as one (llama-server, for this model, answers a forced call
    with several call objects in a row as content): the first JSON call
    object (or array of them) of one of the tools in it, fenced, in
    <tool_call> tags or bare. [(name, arguments JSON)], [] if none."""
    names = {t["function"]["name"] for t in tools or []}
    s = content or ""
    start = min([i for i in (s.find("{"), s.find("[{")) if i >= 0], default=-1)
    if start < 0:
        return []
    try:
        obj, _ = json.JSONDecoder().raw_decode(s[start:])
    except ValueError:
        return []
    calls = []
    for o in obj if isinstance(obj, list) else [obj]:
        if not isinstance(o, dict) or o.get("name") not in names:
            return []
        a = o.get("arguments", o.get("parameters", {}))
        calls.append((o["name"], a if isinstance(a, str) else json.dumps(a)))
    return calls


def run_workload(port, name, args):
    """Every request of workload `name`, summed: a dict with the requests
    and their sums (see summarize)."""
    w = WORKLOADS[name]
    reqs = []
    if w.get("loop"):
        msgs = list(w["messages"])
        client_parsed = 0
        for turn in range(1, w["loop"] + 1):
            m = measure(port, request_body(w, args, args.n_predict, msgs), args, primed=True)
            reqs.append(m)
            calls = m["calls"]
            if not calls:
                calls = client_tool_calls(m["content"], w.get("tools"))
                client_parsed += bool(calls)
            if not calls:
                break  # the model stopped calling tools: what it made still counts
            ids = ["call_%d_%d" % (turn, i) for i in range(len(calls))]
            msgs.append({"role": "assistant", "content": "" if not m["calls"] else
                         (m["content"] or ""), "tool_calls": [
                             {"id": i, "type": "function", "function": {
                                 "name": c[0], "arguments": c[1]}} for i, c in zip(ids, calls)]})
            for i, c in zip(ids, calls):
                msgs.append({"role": "tool", "tool_call_id": i, "name": c[0],
                             "content": agent_tool_result(c[0], c[1])})
        s = summarize(reqs)
        s["client_parsed"] = client_parsed
        s["calls"] = sum(len(m["calls"]) for m in reqs) + client_parsed
        return s
    for _ in range(w.get("repeat", 1)):
        reqs.append(measure(port, request_body(w, args, args.n_predict), args))
    return summarize(reqs)


def total(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) if xs else None


def summarize(reqs):
    """Sums over a workload's requests: tokens, prompt tokens, TTFT (summed
    over requests), decode tok/s = sum(tokens - 1) / sum(decode seconds),
    e2e tok/s, tau and accept from the summed speculation counts (cairn's
    usage.speculative, llama-server's timings)."""
    s = {"requests": reqs, "n_requests": len(reqs)}
    s["tokens"] = total([m["tokens"] for m in reqs])
    s["prompt_tokens"] = total([m["prompt_tokens"] for m in reqs])
    s["ttft"] = total([m["ttft"] for m in reqs])
    timed = [m for m in reqs if m["decode_s"] and m["tokens"]]
    s["decode_tps"] = (sum(m["tokens"] - 1 for m in timed) / sum(m["decode_s"] for m in timed)
                       if timed and len(timed) == len(reqs) else None)
    wall = sum(m["wall"] for m in reqs)
    s["e2e_tps"] = s["tokens"] / wall if s["tokens"] and wall > 0 else None
    s["tau"] = s["accept"] = None
    specs = [m["spec"] for m in reqs if m.get("spec")]
    if specs:
        steps, toks = sum(x.get("steps", 0) for x in specs), sum(x.get("tokens", 0) for x in specs)
        drafted, acc = sum(x.get("drafted", 0) for x in specs), sum(x.get("accepted", 0)
                                                                    for x in specs)
        s["tau"] = toks / steps if steps else None
        s["accept"] = acc / drafted if drafted else None
    tms = [(m["timings"] or {}, m["tokens"] or 0) for m in reqs]
    dn = sum(t.get("draft_n") or 0 for t, _ in tms)
    if dn:
        acc = sum(t.get("draft_n_accepted") or 0 for t, _ in tms)
        pn = sum(t.get("predicted_n") or n for t, n in tms)
        s["accept"] = acc / dn
        if pn > acc:
            s["tau"] = pn / (pn - acc)
    return s


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
                    m = run_workload(port, w, args)
                    results[c.label][w].append(m)
                    extra = ""
                    if "calls" in m:
                        extra = "  %d turn(s), %d call(s)%s" % (
                            m["n_requests"], m["calls"], ", %d parsed by the script" %
                            m["client_parsed"] if m["client_parsed"] else "")
                    print("round %d  %-40s %-10s %5s+%4s tok  ttft %s  %s tok/s  tau %s%s" % (
                        rnd + 1, c.label, w, m["prompt_tokens"], m["tokens"], fmt(m["ttft"], "%.2f"),
                        fmt(m["decode_tps"] if m["decode_tps"] is not None else m["e2e_tps"],
                            "%.2f"), fmt(m["tau"], "%.2f"), extra), file=sys.stderr)
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


def outputs(s):
    """What the identity check compares: every request's text (content and
    tool calls), finish reason and completion token count."""
    return [(m["text"], m["finish"], m["tokens"]) for m in s["requests"]]


def same_output(s, ref):
    return outputs(s) == outputs(ref)


def where_differs(s, ref):
    """'request i from character k: ... vs ...' for the first difference."""
    a, b = outputs(s), outputs(ref)
    for i in range(max(len(a), len(b))):
        if i >= len(a) or i >= len(b):
            return "%d request(s) against %d" % (len(a), len(b))
        if a[i] != b[i]:
            k = first_difference(a[i][0], b[i][0])
            return ("request %d of %d, from character %d: %r vs %r (tokens %s vs %s, finish %s "
                    "vs %s)" % (i + 1, len(b), k, a[i][0][k:k + 40], b[i][0][k:k + 40], a[i][2],
                                b[i][2], a[i][1], b[i][1]))
    return "nowhere"


def cpu_info():
    """(model name, ISA flags of interest present) from /proc/cpuinfo."""
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                k = k.strip()
                if k == "model name" and model == "unknown CPU":
                    model = v.strip()
                elif k in ("flags", "Features") and not flags:
                    flags = set(v.split())
    except OSError:
        pass
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni",
                       "amx_tile", "amx_int8", "asimd", "sve") if f in flags]
    missing = [f for f in ("avx512f", "avx512_vnni", "avx2") if f not in flags]
    return model, isa, missing


def xfmt(x):
    return "-" if x is None else "%.2fx" % x


def report(args, configs, workloads, results):
    rate = "tok/s" if args.no_stream else "decode tok/s"
    model, isa, missing = cpu_info()
    load_end = os.getloadavg()
    print("\nCPU: %s, %d CPUs, ISA %s%s; load average (1/5/15 min) %s at the start, %s at "
          "the end" % (model, os.cpu_count(), " ".join(isa) or "-",
                       " (no %s)" % ", ".join(missing) if missing else "",
                       "/".join("%.1f" % x for x in args.load_start),
                       "/".join("%.1f" % x for x in load_end)))
    print("%s target%s, %d new tokens at most per request, greedy, %d thread(s), %d round(s)%s\n"
          % (short_name(args.model), ", %s draft" % short_name(args.draft_model)
             if args.draft_model else "", args.n_predict, args.threads, args.rounds,
             "" if args.no_stream else ", streamed"))
    if args.interrupted:
        print("(interrupted: cells are medians over the rounds that finished)\n")
    print("| workload | engine | method | requests | prompt | tokens | TTFT s | %s | e2e tok/s | "
          "tau | accept | vs plain cairn | vs plain llama.cpp | same output |" % rate)
    print("|---|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|")
    lossless_failures, notes = [], []
    live = [c for c in configs if c.skip is None and any(results[c.label][w] for w in workloads)]
    summaries = {}
    for w in workloads:
        summary = summaries[w] = {}
        for c in live:
            ms = results[c.label][w]
            if not ms:
                continue
            summary[c.label] = {k: median([m[k] for m in ms]) for k in (
                "n_requests", "prompt_tokens", "tokens", "ttft", "e2e_tps", "tau", "accept")}
            summary[c.label]["rate"] = median([m["e2e_tps"] if args.no_stream else m["decode_tps"]
                                               for m in ms])
            if "calls" in ms[0]:
                summary[c.label]["calls"] = median([m["calls"] for m in ms])
                parsed = max(m["client_parsed"] for m in ms)
                if parsed:
                    notes.append("%s, %s: %d tool call(s) the server returned as content were "
                                 "taken from it by the script" % (w, c.label, parsed))
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
                    msg = "%s on %s: output differs from plain %s at %s" % (
                        c.label, w, c.engine, where_differs(bad[0], plain[0]))
                    if c.engine == "cairn":
                        lossless_failures.append(msg)
                    else:
                        notes.append(msg)
            s["vs_cairn"] = s["rate"] / ref_cairn if s["rate"] and ref_cairn else None
            vs_llama = s["rate"] / ref_llama if s["rate"] and ref_llama and \
                c.engine == "llama.cpp" else None
            nreq = fmt(s["n_requests"], "%d")
            if "calls" in s:
                nreq += " (%d calls)" % s["calls"]
            print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                w, c.engine, c.method, nreq, fmt(s["prompt_tokens"], "%d"),
                fmt(s["tokens"], "%d"), fmt(s["ttft"], "%.2f"), fmt(s["rate"], "%.2f"),
                fmt(s["e2e_tps"], "%.2f"), fmt(s["tau"], "%.2f"), fmt(s["accept"], "%.2f"),
                xfmt(s["vs_cairn"]), xfmt(vs_llama), same))
    print()
    report_summary(workloads, live, summaries, rate)
    if "cairn plain" in results and "llama.cpp plain" in results:
        for w in workloads:
            a, b = results["cairn plain"].get(w), results["llama.cpp plain"].get(w)
            if a and b:
                print("- %s: plain cairn and plain llama.cpp %s" % (
                    w, "say the same" if outputs(a[0]) == outputs(b[0]) else
                    "differ (%s)" % where_differs(a[0], b[0])))
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


def report_summary(workloads, live, summaries, rate):
    """Per workload: plain cairn, each cairn method's speed-up over it,
    llama.cpp plain and its best, and issue 35's goals."""
    cairn_methods = [c for c in live if c.engine == "cairn" and not c.plain]
    llama = [c for c in live if c.engine == "llama.cpp"]
    print("Summary (%s; speed-ups over plain cairn; llama.cpp best = its fastest speculative "
          "config; goals of issue 35)\n" % rate)
    head = ["workload", "plain cairn"] + [c.method for c in cairn_methods] + [
        "cairn best", "llama.cpp plain", "llama.cpp best", "cairn best / llama.cpp best",
        "goal", "goal holds", "ahead of llama.cpp"]
    print("| " + " | ".join(head) + " |")
    print("|---|" + "--:|" * (len(head) - 4) + "---|---|---|")
    for w in workloads:
        s = summaries[w]
        plain = (s.get("cairn plain") or {}).get("rate")
        ups = [(s.get(c.label) or {}).get("vs_cairn") for c in cairn_methods]
        best_c = max(((s[c.label]["rate"], c.method) for c in cairn_methods
                      if (s.get(c.label) or {}).get("rate")), default=None)
        l_plain = (s.get("llama.cpp plain") or {}).get("rate")
        best_l = max(((s[c.label]["rate"], c.method) for c in llama
                      if not c.plain and (s.get(c.label) or {}).get("rate")), default=None)
        goal = GOALS.get(w)
        holds = "-"
        if goal and plain and any(u is not None for u in ups):
            if w == "story":  # never slower: every method
                worst = min(u for u in ups if u is not None)
                holds = "yes" if worst >= goal else "NO (slowest %.2fx)" % worst
            else:
                best = best_c[0] / plain
                holds = "yes" if best >= goal else "NO (%.2fx)" % best
        # ahead of llama.cpp: of its best config, plain included
        l_all = max([x for x in (l_plain, best_l and best_l[0]) if x], default=None)
        ahead = "-" if not (best_c and l_all) else ("yes" if best_c[0] > l_all else "NO")
        cells = [w, fmt(plain, "%.2f")] + [xfmt(u) for u in ups] + [
            "-" if not best_c else "%s %.2f (%.2fx)" % (best_c[1], best_c[0],
                                                        best_c[0] / plain if plain else 0),
            fmt(l_plain, "%.2f"),
            "-" if not best_l else "%s %.2f" % (best_l[1], best_l[0]),
            "-" if not (best_c and best_l) else "%.2fx" % (best_c[0] / best_l[0]),
            "-" if not goal else ("%s %.2fx" % ("every method >=" if w == "story" else ">=",
                                                goal)),
            holds, ahead]
        print("| " + " | ".join(cells) + " |")
    print()


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
        help="a smaller model of the same vocabulary (cairn draft:, llama.cpp --model-draft; "
             "'none': no draft model)")
    ap.add_argument("--eagle-head", help="EAGLE head GGUF for the target (cairn eagle:)")
    ap.add_argument("--medusa-heads", help="Medusa heads GGUF for the target (cairn medusa:)")
    ap.add_argument("--methods", default=DEFAULT_CAIRN_METHODS,
                    help="cairn --spec methods, comma-separated, any name the server knows "
                         "(suffix, ngram, draft, eagle, medusa, NAME:VALUE); join with + to "
                         "combine (suffix+draft) (default %(default)s; 'none' for plain only)")
    ap.add_argument("--llama-methods", default=DEFAULT_LLAMA_METHODS,
                    help="llama-server --spec-type values and/or 'draft' (draft-simple with "
                         "--model-draft); + combines (default %(default)s; 'none' for plain "
                         "only)")
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
    if args.draft_model in ("", "none"):
        args.draft_model = None
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
    args.load_start = os.getloadavg()
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
