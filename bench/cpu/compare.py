#!/usr/bin/env python3
"""CPU speed of cairn against llama.cpp on the same GGUF files and machine.

For each model, runs `cairn bench --json` and (when a llama.cpp build is
given) `llama-bench -o jsonl`, alternating them --rounds times so that load
from other users hits both alike, and prints the median tokens/s of each, the
ratio cairn / llama.cpp, and decode as a fraction of this machine's memory
bandwidth limit: (model bytes read per token) / (measured copy bandwidth).

    bench/cpu/compare.py --cairn build/cairn --llama /path/to/llama.cpp/build \\
        -t 2 -p 512 -n 128 --rounds 3 MODEL.gguf [MODEL.gguf ...]

Synthetic models come from tools/gen_synthetic_model.py (write them outside
the repository). Without --llama (or $LLAMA_CPP_BUILD) only cairn is run.

On CPUs that report AMX but whose kernel/hypervisor cannot run it, a
-march=native llama.cpp dies with SIGILL in its AMX matmul; pass --no-amx to
run llama-bench under bench/cpu/no_amx_shim.c (built here on the fly), which
makes llama.cpp take its own "AMX unavailable" path (AVX-512 + repacking).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def copy_bandwidth(threads, mib=512):
    """Memory copy bandwidth in bytes/s (read + write counted), measured with
    a small C program so the figure is not Python's."""
    src = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static size_t n; static char *a, *b; static int T;
static void *run(void *p) { long i = (long)p; size_t part = n / T;
  memcpy(b + i * part, a + i * part, part); return NULL; }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int c, char **v) { T = atoi(v[1]); n = (size_t)atoi(v[2]) << 20;
  a = malloc(n); b = malloc(n); memset(a, 1, n); memset(b, 2, n);
  double best = 1e30;
  for (int r = 0; r < 7; r++) { pthread_t th[64]; double t0 = now();
    for (long i = 0; i < T; i++) pthread_create(&th[i], 0, run, (void *)i);
    for (int i = 0; i < T; i++) pthread_join(th[i], 0);
    double dt = now() - t0; if (dt < best) best = dt; }
  printf("%f\n", 2.0 * n / best); return 0; }
"""
    with tempfile.TemporaryDirectory() as d:
        c, exe = os.path.join(d, "bw.c"), os.path.join(d, "bw")
        open(c, "w").write(src)
        subprocess.run(["cc", "-O2", "-o", exe, c, "-lpthread"], check=True)
        out = subprocess.run([exe, str(threads), str(mib)], check=True, capture_output=True, text=True)
        return float(out.stdout.strip())


def build_shim(d):
    so = os.path.join(d, "no_amx_shim.so")
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", so,
                    os.path.join(HERE, "no_amx_shim.c"), "-ldl"], check=True)
    return so


def run_cairn(cairn, model, a):
    cmd = [cairn, "bench", "-m", model, "-t", str(a.threads), "-p", str(a.n_prompt),
           "-n", str(a.n_gen), "-r", str(a.reps), "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    j = json.loads(out.strip().splitlines()[-1])
    return j["pp"], j["tg"]


def run_llama(llama_bench, model, a, shim):
    cmd = [llama_bench, "-m", model, "-t", str(a.threads), "-p", str(a.n_prompt),
           "-n", str(a.n_gen), "-r", str(a.reps), "-o", "jsonl"]
    env = dict(os.environ)
    if shim:
        env["LD_PRELOAD"] = shim
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    pp = tg = None
    for line in out.splitlines():
        if not line.startswith("{"):
            continue
        j = json.loads(line)
        if j.get("n_prompt", 0) > 0 and j.get("n_gen", 0) == 0:
            pp = j["avg_ts"]
        elif j.get("n_gen", 0) > 0 and j.get("n_prompt", 0) == 0:
            tg = j["avg_ts"]
    return pp, tg


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--cairn", default=os.path.join(os.getcwd(), "build", "cairn"))
    ap.add_argument("--llama", default=os.environ.get("LLAMA_CPP_BUILD"),
                    help="llama.cpp build dir (containing bin/llama-bench)")
    ap.add_argument("--no-amx", action="store_true", help="run llama-bench under the no-AMX shim")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-r", "--reps", type=int, default=3, help="repetitions inside each run")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per model")
    a = ap.parse_args()

    llama_bench = None
    if a.llama:
        for cand in (os.path.join(a.llama, "bin", "llama-bench"), os.path.join(a.llama, "llama-bench")):
            if os.path.exists(cand):
                llama_bench = cand
        if not llama_bench:
            sys.exit("no llama-bench under %s" % a.llama)

    bw = copy_bandwidth(a.threads)
    print("copy bandwidth (%d threads): %.1f GB/s" % (a.threads, bw / 1e9), file=sys.stderr)
    rows = []
    # 1-minute load average after each round: on a small machine another
    # busy process shows up here and explains an outlier.
    load_start, loads = os.getloadavg()[0], []
    with tempfile.TemporaryDirectory() as d:
        shim = build_shim(d) if (llama_bench and a.no_amx) else None
        for model in a.models:
            c_pp, c_tg, l_pp, l_tg = [], [], [], []
            for r in range(a.rounds):
                pp, tg = run_cairn(a.cairn, model, a)
                c_pp.append(pp); c_tg.append(tg)
                if llama_bench:
                    pp, tg = run_llama(llama_bench, model, a, shim)
                    l_pp.append(pp); l_tg.append(tg)
                loads.append(os.getloadavg()[0])
                print("%s round %d: cairn pp %.1f tg %.1f%s (load %.2f)" % (
                    os.path.basename(model), r + 1, c_pp[-1], c_tg[-1],
                    " | llama.cpp pp %.1f tg %.1f" % (l_pp[-1], l_tg[-1]) if llama_bench else "",
                    loads[-1]), file=sys.stderr)
            # Bytes read per generated token ~ the whole file (every weight
            # once; the embedding table is only looked up, the KV is small).
            size = os.path.getsize(model)
            med = statistics.median
            rows.append((os.path.basename(model), med(c_pp), med(c_tg),
                         med(l_pp) if l_pp else None, med(l_tg) if l_tg else None,
                         med(c_tg) * size / bw))

    print("\n| model | cairn pp%d | llama.cpp pp%d | pp ratio | cairn tg%d | llama.cpp tg%d | tg ratio | "
          "cairn tg / bandwidth limit |" % (a.n_prompt, a.n_prompt, a.n_gen, a.n_gen))
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, cpp, ctg, lpp, ltg, frac in rows:
        f = lambda v: "%.1f" % v if v is not None else "-"
        ratio = lambda x, y: "%.2f" % (x / y) if y else "-"
        print("| %s | %s | %s | %s | %s | %s | %s | %.0f%% |" % (
            name, f(cpp), f(lpp), ratio(cpp, lpp), f(ctg), f(ltg), ratio(ctg, ltg), 100 * frac))
    print("\n%d threads, medians of %d alternating rounds (each %d reps); copy bandwidth %.1f GB/s"
          % (a.threads, a.rounds, a.reps, bw / 1e9))
    print("load average (1 min): %.2f at the start, %.2f median and %.2f max after the rounds"
          % (load_start, statistics.median(loads) if loads else 0.0, max(loads) if loads else 0.0))


if __name__ == "__main__":
    main()
