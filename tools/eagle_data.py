#!/usr/bin/env python3
"""Write EAGLE training sequences (token ids) by letting cairn answer prompts.

    eagle_data.py --cairn build/cairn -m MODEL -o data.jsonl [--n-prompts 300]

The target writes its own training text (self-distillation): each prompt of
tools/eagle_prompts.py is formatted with the model's chat template
(`cairn chat-format`), tokenized by the server (special tokens parsed), and
answered by `cairn serve` (many requests decode in one batch, far faster than
one `cairn run` each). A share of the answers is greedy, the rest sampled at
the temperatures of --temps with a seed per prompt, so the head sees the
distribution it will draft for at temperature 0 and some variety.

Output: one JSON object a line, {"prompt_len": P, "ids": [...], "temp": T},
ids = prompt tokens then the answer (ending with the end-of-turn token when
the model stopped by itself). Deterministic for a given machine and seed
(greedy batched decoding equals `cairn run`; sampled requests carry seeds).
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "clients", "python"))
import eagle_prompts  # noqa: E402
from cairn_client import Client  # noqa: E402


def chat_text(cairn, model, system, user):
    msgs = ([{"role": "system", "content": system}] if system else []) + \
        [{"role": "user", "content": user}]
    r = subprocess.run([cairn, "chat-format", "-m", model, "--messages", "-"],
                       input=json.dumps(msgs).encode(), capture_output=True, check=True)
    return r.stdout.decode()


def start_server(cairn, model, threads, max_seqs, log_path):
    """cairn serve on a free port; its log goes to log_path (never a pipe
    nobody drains)."""
    log = open(log_path, "w")
    p = subprocess.Popen([cairn, "serve", "-m", model, "--port", "0", "-t", str(threads),
                          "--max-seqs", str(max_seqs), "--no-prefix-cache"],
                         stderr=log, stdout=subprocess.DEVNULL)
    for _ in range(600):
        time.sleep(0.1)
        m = re.search(r"listening\D*?(\d+\.\d+\.\d+\.\d+):(\d+)", open(log_path).read())
        if m:
            return p, int(m.group(2))
        if p.poll() is not None:
            break
    p.kill()
    raise SystemExit("eagle_data.py: cairn serve did not start; see " + log_path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cairn", default="build/cairn")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--n-prompts", type=int, default=300)
    ap.add_argument("--max-tokens", type=int, default=160, help="answer length cap")
    ap.add_argument("--greedy-share", type=float, default=0.5)
    ap.add_argument("--temps", default="0.7,1.0", help="temperatures of the sampled answers")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-seqs", type=int, default=16, help="requests decoded at once")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    rng = random.Random(a.seed)
    temps = [float(t) for t in a.temps.split(",")]
    jobs = []
    for i, (system, user) in enumerate(eagle_prompts.prompts(a.n_prompts, a.seed)):
        greedy = rng.random() < a.greedy_share
        jobs.append(dict(text=chat_text(a.cairn, a.model, system, user),
                         temp=0.0 if greedy else temps[i % len(temps)], seed=a.seed * 100003 + i))

    t0 = time.time()
    server, port = start_server(a.cairn, a.model, a.threads, a.max_seqs, a.output + ".serve.log")
    try:
        c = Client("127.0.0.1", port, timeout=3600)
        end_of_turn = c.tokenize("<|im_end|>", add_bos=False, parse_special=True)
        pending = []
        for j in jobs:
            j["prompt"] = c.tokenize(j["text"], parse_special=True)
            params = dict(tokens=j["prompt"], max_tokens=a.max_tokens, temperature=j["temp"],
                          seed=j["seed"])
            pending.append(c.call_async("generate", params))
        n_gen = 0
        with open(a.output, "w") as f:
            for j, call in zip(jobs, pending):
                r = call.result(timeout=3600)
                ans = list(r["tokens"])
                if r["finish_reason"] == "stop" and len(end_of_turn) == 1:
                    ans += end_of_turn
                n_gen += len(ans)
                f.write(json.dumps(dict(prompt_len=len(j["prompt"]), ids=j["prompt"] + ans,
                                        temp=j["temp"])) + "\n")
        c.close()
    finally:
        server.terminate()
        server.wait()
    print("eagle_data.py: %d answers, %d generated tokens in %.0f s (%.1f tok/s)"
          % (len(jobs), n_gen, time.time() - t0, n_gen / (time.time() - t0)), file=sys.stderr)


if __name__ == "__main__":
    main()
