#!/usr/bin/env python3
"""The model families beyond the dense llama/qwen ones, side by side with
llama.cpp in one run: Gemma 3 (sliding-window layers), a mixture of
experts (qwen3moe) and gpt-oss (attention sinks, alternating windows, MXFP4
experts).

1. speed: pp512 and tg128 at depth 0 and 4096, `cairn bench` against
   `llama-bench` alternated (3 rounds, medians), with each side's peak RSS;
2. KV bytes per token of context, and what a 32k-token Gemma 3 session
   holds against the floor (global layers x context + local layers x
   window);
3. a multi-turn Gemma 3 chat over a ~2k-token document, the whole
   conversation resent every turn as OpenAI clients do: prompt tokens each
   engine computed per turn (cairn: prompt - cached; llama-server with its
   defaults, no --swa-full: its timings.prompt_n), beside the distinct
   tokens the turn added.

Models: the real Gemma 3 270M (scripts/get-model gemma3-270m-q4_k_m) and a
synthetic qwen3moe of 3.5B total / ~0.6B active parameters in Q4_K and a
synthetic gpt-oss of 1.3B total / ~0.25B active (gpt-oss-20b's layout
scaled down: MXFP4 experts, Q8_0 elsewhere, 128-token windows on every
other layer, YaRN) written by tools/gen_synthetic_model.py into a temporary
directory (or --moe FILE / --oss FILE).

    bench/models/bench_families.py --llama /path/to/llama.cpp/build

Tokens/s move with the load on a shared machine: compare the ratios, and
only within one run. Nothing here is a test.
"""
import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
GEMMA = os.path.join(ROOT, "models", "gemma3-270m-q4_k_m.gguf")
MOE_ARGS = ["--dim", "2048", "--layers", "16", "--heads", "16", "--kv-heads", "4", "--head-dim",
            "128", "--ffn", "6144", "--vocab", "32000", "--type", "Q4_K", "--arch", "qwen3moe",
            "--experts", "32", "--experts-used", "4", "--expert-ffn", "1024", "--ctx", "32768"]
OSS_ARGS = ["--dim", "1024", "--layers", "12", "--heads", "16", "--kv-heads", "4", "--head-dim",
            "64", "--ffn", "1024", "--vocab", "32000", "--type", "Q8_0", "--arch", "gpt-oss",
            "--experts", "32", "--experts-used", "4", "--expert-ffn", "1024",
            "--expert-type", "MXFP4", "--sliding-window", "128", "--ctx", "32768"]


def speed(a, model, depth):
    """Medians of (cairn pp, cairn tg, llama pp, llama tg) and peak RSS (MiB) of each."""
    cp, cg, lp, lg, crss, lrss = [], [], [], [], [], []
    for _ in range(a.rounds):
        for side in ("cairn", "llama"):
            if side == "cairn":
                cmd = [a.cairn, "bench", "-m", model, "-t", str(a.threads), "-p", "512", "-n",
                       "128", "-r", "1", "-d", str(depth), "--json", "--no-bandwidth"]
            else:
                cmd = [os.path.join(a.llama, "bin", "llama-bench"), "-m", model, "-t",
                       str(a.threads), "-p", "512", "-n", "128", "-r", "1", "-d", str(depth),
                       "-o", "jsonl"]
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True)
            out = p.stdout.read()
            _, status, usage = os.wait4(p.pid, 0)
            if status != 0:
                sys.exit("%s failed (status %d)" % (" ".join(cmd), status))
            rss = usage.ru_maxrss / 1024
            if side == "cairn":
                j = json.loads(out.strip().splitlines()[-1])
                cp.append(j["pp"])
                cg.append(j["tg"])
                crss.append(rss)
            else:
                for line in out.splitlines():
                    j = json.loads(line)
                    (lp if j["n_prompt"] > 0 else lg).append(j["avg_ts"])
                lrss.append(rss)
    med = statistics.median
    return med(cp), med(cg), med(lp), med(lg), max(crss), max(lrss)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def post(url, body, timeout=600):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def wait_http(url, proc, what):
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit("%s exited at start" % what)
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except Exception:
            time.sleep(0.2)
    sys.exit("%s did not start" % what)


def gemma_prompt(doc, turns):
    """The Gemma turn format (what cairn's template gives), as raw text."""
    text = "<start_of_turn>user\nAnswer from this document.\n\n" + doc + "\n\n"
    for i, (q, reply) in enumerate(turns):
        text += ("" if i == 0 else "<start_of_turn>user\n") + q + "<end_of_turn>\n"
        text += "<start_of_turn>model\n"
        if reply is not None:
            text += reply + "<end_of_turn>\n"
    return text


QUESTIONS = ["Who publishes this licence?", "What is it called?", "Can I sell copies?",
             "Must I share the source?", "What about patents?", "Is there a warranty?"]


def chat_plan(doc_a, doc_b):
    """Requests as (label, conversation, question, edit): six turns of one
    chat; then two chats over two documents taking turns (two users on one
    server); then the last question of the first chat asked differently
    (regenerate after an edit: the prompt leaves the history at its end)."""
    plan = [("A%d" % (i + 1), "A", q, False) for i, q in enumerate(QUESTIONS)]
    for i, q in enumerate(QUESTIONS[:3]):
        plan += [("B%d" % (i + 1), "B", q, False), ("C%d" % (i + 1), "C", q, False)]
    plan.append(("A6 edited", "A", "Is there any warranty at all?", True))
    return plan, {"A": doc_a, "B": doc_b, "C": doc_a}


def chat_turns(a):
    """Per request: (label, prompt tokens, distinct new tokens, cairn computed,
    llama.cpp computed). Distinct: the prompt less its longest token prefix
    shared with any earlier request's prompt and reply."""
    text = open(os.path.join(ROOT, "tests", "data", "text", "gpl-3.txt")).read()
    plan, docs = chat_plan(text[:10000], text[15000:25000])
    cport, lport = free_port(), free_port()
    cairn = subprocess.Popen([a.cairn, "serve", "-m", GEMMA, "--http-port", str(cport), "--port",
                              "0", "-t", str(a.threads)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    llama = subprocess.Popen([os.path.join(a.llama, "bin", "llama-server"), "-m", GEMMA,
                              "--port", str(lport), "-t", str(a.threads), "-c", "16384"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows, seen, history = [], [], {k: [] for k in docs}
    try:
        wait_http("http://127.0.0.1:%d/health" % cport, cairn, "cairn serve")
        wait_http("http://127.0.0.1:%d/health" % lport, llama, "llama-server")
        tokenize = lambda t: post("http://127.0.0.1:%d/tokenize" % cport,
                                  {"content": t, "add_special": True,
                                   "parse_special": True})["tokens"]
        for label, conv, q, edit in plan:
            turns = history[conv][:-1] if edit else history[conv]
            turns = turns + [(q, None)]
            prompt = gemma_prompt(docs[conv], turns)
            ids = tokenize(prompt)
            shared = max([len(os.path.commonprefix([ids, s])) for s in seen] or [0])
            c = post("http://127.0.0.1:%d/v1/completions" % cport,
                     {"model": "gemma", "prompt": prompt, "max_tokens": 32, "temperature": 0})
            reply = c["choices"][0]["text"]
            usage = c["usage"]
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            l = post("http://127.0.0.1:%d/completion" % lport,
                     {"prompt": prompt, "n_predict": 32, "temperature": 0, "cache_prompt": True})
            if len(ids) != usage["prompt_tokens"]:
                sys.exit("tokenize gave %d tokens, the request %d" % (len(ids),
                                                                      usage["prompt_tokens"]))
            rows.append((label, usage["prompt_tokens"], usage["prompt_tokens"] - shared,
                         usage["prompt_tokens"] - cached, l["timings"]["prompt_n"]))
            seen.append(tokenize(prompt + reply))
            if not edit:
                history[conv] = turns[:-1] + [(q, reply)]
    finally:
        for p in (cairn, llama):
            p.terminate()
            p.wait()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cairn", default=os.path.join(ROOT, "build", "cairn"))
    ap.add_argument("--llama", default=os.environ.get("LLAMA_CPP_BUILD"),
                    help="a llama.cpp build directory (with bin/)")
    ap.add_argument("--moe", help="a qwen3moe GGUF (default: a synthetic one written here)")
    ap.add_argument("--oss", help="a gpt-oss GGUF (default: a synthetic one written here)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default="gemma,moe,oss", help="speed: which of gemma,moe,oss")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--skip-chat", action="store_true")
    a = ap.parse_args()
    if not a.llama:
        sys.exit("--llama (or $LLAMA_CPP_BUILD) must name a llama.cpp build directory")
    if not os.path.exists(GEMMA):
        sys.exit("%s is missing: scripts/get-model gemma3-270m-q4_k_m" % GEMMA)
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    name = re.search(r"Model name:\s*(.*)", cpu)
    isa = "AVX-512" if "avx512f" in cpu else "AVX2"
    print("CPU: %s (%s), %d threads\n" % (name.group(1) if name else "?", isa, a.threads))

    with tempfile.TemporaryDirectory() as d:
        moe, oss = a.moe, a.oss
        wanted = a.models.split(",") if not a.skip_speed else []
        if not moe and "moe" in wanted:
            moe = os.path.join(d, "moe.gguf")
            subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen_synthetic_model.py"),
                            *MOE_ARGS, "-o", moe], check=True, capture_output=True)
        if not oss and "oss" in wanted:
            oss = os.path.join(d, "oss.gguf")
            subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen_synthetic_model.py"),
                            *OSS_ARGS, "-o", oss], check=True, capture_output=True)
        if not a.skip_speed:
            print("## speed (tokens/s, medians of %d alternated rounds; peak RSS)" % a.rounds)
            print("| model | test | cairn | llama.cpp | ratio | cairn RSS | llama.cpp RSS |")
            print("|---|---|---|---|---|---|---|")
            for key, label, model in (("gemma", "Gemma 3 270M Q4_K_M", GEMMA),
                                      ("moe", "qwen3moe 3.5B-A0.6B Q4_K (synthetic)", moe),
                                      ("oss", "gpt-oss 1.3B-A0.25B MXFP4 (synthetic)", oss)):
                if key not in wanted:
                    continue
                for depth in (0, 4096):
                    cp, cg, lp, lg, cr, lr = speed(a, model, depth)
                    at = "" if depth == 0 else " @ d%d" % depth
                    for test, c, l in (("pp512" + at, cp, lp), ("tg128" + at, cg, lg)):
                        print("| %s | %s | %.1f | %.1f | %.2fx | %.0f MiB | %.0f MiB |"
                              % (label, test, c, l, c / l, cr, lr))
                    sys.stdout.flush()
            print()

    # KV per token of context (F16 K and V, both engines' default)
    n_layer, n_kv, hd = 18, 1, 256  # Gemma 3 270M
    window, period, ctx = 512, 6, 32768
    per_layer = 2 * n_kv * hd * 2
    n_global = sum(1 for l in range(n_layer) if l % period == period - 1)
    floor = n_global * ctx * per_layer + (n_layer - n_global) * window * per_layer
    cairn_kv = n_layer * ctx * per_layer
    print("## KV of a 32k-token Gemma 3 270M session (F16)")
    print("| | bytes per token of context | 32k session | vs floor |")
    print("|---|---|---|---|")
    print("| floor (%d global layers x context + %d local x window %d) | %d | %.1f MiB | 1.00x |"
          % (n_global, n_layer - n_global, window, n_global * per_layer, floor / 2**20))
    print("| cairn (every layer keeps every token) | %d | %.1f MiB | %.2fx |"
          % (n_layer * per_layer, cairn_kv / 2**20, cairn_kv / floor))
    print()

    if a.skip_chat:
        return
    print("## Gemma 3 chats over ~2k-token documents, each turn resent whole (OpenAI style)")
    print("A: one chat, 6 turns; then B and C, two more users taking turns, 3 turns each (C "
          "asks A's\nquestions over A's document, as users of one FAQ bot do); last: A's sixth "
          "question asked\nagain in other words (an edit, then regenerate).\n")
    print("| request | prompt tokens | distinct new | cairn computed | llama.cpp computed |")
    print("|---|---|---|---|---|")
    rows = chat_turns(a)
    tot = [0, 0, 0]
    for label, prompt, new, ours, theirs in rows:
        print("| %s | %d | %d | %d | %d |" % (label, prompt, new, ours, theirs))
        tot = [tot[0] + new, tot[1] + ours, tot[2] + theirs]
    print("| all | | %d | %d (%.3fx) | %d (%.2fx) |"
          % (tot[0], tot[1], tot[1] / tot[0], tot[2], tot[2] / tot[0]))


if __name__ == "__main__":
    main()
