#!/usr/bin/env python3
"""cairn serve against vLLM's CPU build on the same Hugging Face folder, one client for both.

Both servers get the same OpenAI requests from vLLM's own load generator
(`vllm bench serve`, from the vLLM install given with --vllm), one server at
a time, alternating over --rounds so that other users of the machine hit both
alike; the table gives the medians and the cairn / vLLM ratios:

  - stream16: 16 streaming clients, random prompts of --input-len tokens and
    --output-len generated tokens each (ignore_eos, so both generate the
    same lengths), --prompts requests in all;
  - prefix4: `--dataset-name prefix_repetition` at concurrency 4: prompts
    that share a few long prefixes, as RAG and agent traffic do.

    bench/serve/compare_vllm.py --model build/ckpt/qwen-bf16 --vllm $SCRATCH/vllm \\
        [--cairn build/cairn] [--threads 2] [--rounds 2]

--vllm is a virtual environment where vLLM's CPU wheel is installed
(../shared/peers/README.md says how; nothing of it is built or committed
here). vLLM runs as its CPU guide recommends (bfloat16, prefix caching on,
--generation-config vllm so a greedy request is greedy); its start-up takes
one to three minutes. cairn runs `serve -m FOLDER --http-port`. Reported per
server and workload: output tokens/s, TTFT p50 and p99 (ms), as `vllm bench
serve` measures them, and both servers' resident memory after the runs.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def wait_ready(port, proc, timeout):
    url = "http://127.0.0.1:%d/v1/models" % port
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            sys.exit("server exited with %d before it was ready" % proc.returncode)
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return json.load(r)["data"][0]["id"]
        except Exception:
            time.sleep(1)
    sys.exit("server on port %d not ready after %d s" % (port, timeout))


def rss_mb(pid):
    """Resident memory of pid and its children (vLLM runs an engine process)."""
    total = 0
    pids = [pid]
    try:
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
        pids += [int(x) for x in out.split()]
    except OSError:
        pass
    for p in pids:
        try:
            with open("/proc/%d/status" % p) as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024.0


def start(kind, a, port, log):
    if kind == "cairn":
        cmd = [a.cairn, "serve", "-m", a.model, "--http-port", str(port), "--port", "0",
               "--threads", str(a.threads)]
        env = dict(os.environ)
    else:
        cmd = [os.path.join(a.vllm, "bin", "vllm"), "serve", a.model, "--dtype", "bfloat16",
               "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "8192",
               "--enable-prefix-caching", "--generation-config", "vllm"]
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="4", VLLM_CPU_OMP_THREADS_BIND="auto",
                   VLLM_HOST_IP="127.0.0.1", HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def bench(a, port, name, workload, out_dir):
    res = os.path.join(out_dir, "%s-%d.json" % (workload, time.time_ns()))
    cmd = [os.path.join(a.vllm, "bin", "vllm"), "bench", "serve", "--backend", "openai",
           "--base-url", "http://127.0.0.1:%d" % port, "--endpoint", "/v1/completions",
           "--model", name, "--tokenizer", a.model, "--save-result",
           "--result-filename", res, "--seed", "7", "--ignore-eos"]
    if workload == "stream16":
        cmd += ["--dataset-name", "random", "--random-input-len", str(a.input_len),
                "--random-output-len", str(a.output_len), "--num-prompts", str(a.prompts),
                "--max-concurrency", "16"]
    else:
        cmd += ["--dataset-name", "prefix_repetition",
                "--prefix-repetition-prefix-len", str(a.input_len),
                "--prefix-repetition-suffix-len", "64",
                "--prefix-repetition-num-prefixes", "4",
                "--prefix-repetition-output-len", str(a.output_len),
                "--num-prompts", str(a.prompts // 2), "--max-concurrency", "4"]
    r = subprocess.run(cmd, capture_output=True, text=True,
                       env=dict(os.environ, HF_HUB_OFFLINE="1"))
    if r.returncode != 0 or not os.path.exists(res):
        sys.exit("vllm bench serve failed:\n" + (r.stdout + r.stderr)[-3000:])
    with open(res) as f:
        j = json.load(f)
    return {"tok_s": j["output_throughput"], "ttft_p50": j["median_ttft_ms"],
            "ttft_p99": j["p99_ttft_ms"], "done": j["completed"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a Hugging Face folder (BF16)")
    ap.add_argument("--vllm", required=True, help="the virtual environment with vLLM")
    ap.add_argument("--cairn", default=os.path.join(ROOT, "build", "cairn"))
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--workloads", default="stream16,prefix4")
    a = ap.parse_args()
    workloads = a.workloads.split(",")
    res = {k: {w: [] for w in workloads} for k in ("cairn", "vllm")}
    rss = {}
    with tempfile.TemporaryDirectory() as d:
        for r in range(a.rounds):
            for kind in ("cairn", "vllm"):
                port = 18600 + r * 2 + (kind == "vllm")
                with open(os.path.join(d, kind + ".log"), "a") as log:
                    p = start(kind, a, port, log)
                    try:
                        name = wait_ready(port, p, 600)
                        for w in workloads:
                            m = bench(a, port, name, w, d)
                            res[kind][w].append(m)
                            print("round %d %s %s: %.1f tok/s, TTFT p50 %.0f ms p99 %.0f ms" % (
                                r + 1, kind, w, m["tok_s"], m["ttft_p50"], m["ttft_p99"]),
                                file=sys.stderr)
                        rss[kind] = rss_mb(p.pid)
                    finally:
                        os.killpg(p.pid, signal.SIGTERM)
                        try:
                            p.wait(60)
                        except subprocess.TimeoutExpired:
                            os.killpg(p.pid, signal.SIGKILL)
    med = lambda k, w, f: statistics.median(m[f] for m in res[k][w])
    print("\n| workload | cairn tok/s | vLLM tok/s | cairn/vLLM | cairn TTFT p50 / p99 ms | "
          "vLLM TTFT p50 / p99 ms | p99 cairn/vLLM |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for w in workloads:
        c, v = med("cairn", w, "tok_s"), med("vllm", w, "tok_s")
        print("| %s | %.1f | %.1f | %.2f | %.0f / %.0f | %.0f / %.0f | %.2f |" % (
            w, c, v, c / v, med("cairn", w, "ttft_p50"), med("cairn", w, "ttft_p99"),
            med("vllm", w, "ttft_p50"), med("vllm", w, "ttft_p99"),
            med("cairn", w, "ttft_p99") / med("vllm", w, "ttft_p99")))
    print("\n%s, %d threads for cairn; medians of %d alternating rounds; %d prompts of %d "
          "tokens (+%d generated) for stream16, half as many for prefix4; resident memory "
          "after the runs: cairn %.0f MB, vLLM %.0f MB" % (
              os.path.basename(os.path.normpath(a.model)), a.threads, a.rounds, a.prompts,
              a.input_len, a.output_len, rss.get("cairn", 0), rss.get("vllm", 0)))


if __name__ == "__main__":
    main()
