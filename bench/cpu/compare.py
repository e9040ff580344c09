#!/usr/bin/env python3
"""CPU speed of cairn against llama.cpp (and ik_llama.cpp) on the same GGUF files and machine.

For each model and depth, runs `cairn bench --json` and (when builds are
given) llama.cpp's and ik_llama.cpp's `llama-bench`, alternating them
--rounds times so that load from other users hits all alike, and prints the
median tokens/s of each, the ratios cairn / llama.cpp and cairn / ik_llama.cpp,
and decode as a fraction of this machine's read bandwidth:
(bytes one decode step reads) x (tg tokens/s) / (read bandwidth). Both
figures come from cairn bench itself: its bytes/token (the weights a token
reads plus the KV at the tg run's mean context) and the read bandwidth it
measures in the same run with the same threads; a peer's fraction uses the
same bytes/token (it reads the same weights and, at F16, the same KV).

    bench/cpu/compare.py --cairn build/cairn --llama /path/to/llama.cpp/build \\
        [--ik /path/to/ik_llama.cpp/build] -t 2 -p 512 -n 128 -d 0,4096 --rounds 3 \\
        MODEL.gguf [MODEL.gguf ...]

Depth (-d, a list): tokens of context in the KV cache before each measured
test, passed to `cairn bench -d` and `llama-bench -d`. llama.cpp runs with
`-fa 1` at depth > 0 (its default, `-fa auto`, at depth 0; --llama-fa sets
one value for all). ik_llama.cpp runs with its best CPU settings, `-rtr 1
-fa 1`; its llama-bench has no -d, so at depth > 0 its tg is `-gp D,N` (N
tokens generated after a D-token prompt, the prompt untimed) and it has no
pp at depth (a dash in the table). The table says what each peer ran with.

Synthetic models come from tools/gen_synthetic_model.py (write them outside
the repository; give --ctx at least the largest depth plus the test, since
cairn bench refuses a depth past the trained context). Without --llama (or
$LLAMA_CPP_BUILD) and --ik only cairn is run.

--suite DIR runs the models of the decode issue's table instead of a list:
the synthetic 1B Q4_0 and 110M Q4_0/Q8_0/F16 (written into DIR by
tools/gen_synthetic_model.py when missing) and the real Qwen2.5-Coder 0.5B
and 1.5B Q4_K_M (scripts/get-model, into models/). The table is preceded by
the CPU it ran on (model name and the vector extensions that choose cairn's
kernels), since the same build is twice as fast on one x86 server as on
another.

On CPUs that report AMX but whose kernel/hypervisor cannot run it, a
-march=native llama.cpp dies with SIGILL in its AMX matmul; pass --no-amx to
run the peers' llama-bench under bench/cpu/no_amx_shim.c (built here on the
fly), which makes ggml take its own "AMX unavailable" path (AVX-512 +
repacking).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def build_shim(d):
    so = os.path.join(d, "no_amx_shim.so")
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", so,
                    os.path.join(HERE, "no_amx_shim.c"), "-ldl"], check=True)
    return so


def find_llama_bench(build, what):
    for cand in (os.path.join(build, "bin", "llama-bench"), os.path.join(build, "llama-bench")):
        if os.path.exists(cand):
            return cand
    sys.exit("no llama-bench under %s (%s)" % (build, what))


def run_checked(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit("%s failed (exit %d):\n%s" % (" ".join(cmd), r.returncode, r.stderr[-2000:]))
    return r.stdout


def run_cairn(cairn, model, a, depth):
    """cairn bench's JSON record (pp, tg, bytes_per_token, read_bw_gbps, ...)."""
    cmd = [cairn, "bench", "-m", model, "-t", str(a.threads), "-p", str(a.n_prompt),
           "-n", str(a.n_gen), "-r", str(a.reps), "--json"]
    if depth > 0:
        cmd += ["-d", str(depth)]
    out = run_checked(cmd)
    return json.loads(out.strip().splitlines()[-1])


def bench_records(out):
    """llama-bench's records, from -o jsonl (one object a line) or -o json
    (one array)."""
    text = out.strip()
    if text.startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


class Peer:
    """One llama-bench build: how to ask it for pp and tg at a depth."""

    def __init__(self, label, binary, shim, ik, fa):
        self.label, self.binary, self.ik = label, binary, ik
        self.env = dict(os.environ)
        if shim:
            self.env["LD_PRELOAD"] = shim
        helptext = subprocess.run([binary, "--help"], capture_output=True, text=True,
                                  env=self.env).stdout
        self.has_depth = "--n-depth" in helptext
        self.has_jsonl = "jsonl" in helptext
        self.fa = fa  # llama.cpp: None = -fa 1 at depth > 0, its default at 0

    def flags(self, depth, n_gen):
        """The flags beyond -m -t -r -o that this peer runs with at depth
        (n_gen: the tg test's length, for -gp)."""
        if self.ik:
            f = ["-rtr", "1", "-fa", "1"]
        elif self.fa is not None:
            f = ["-fa", self.fa]
        else:
            f = ["-fa", "1"] if depth > 0 else []
        if depth > 0 and not self.has_depth:
            # tg after an untimed depth-token prompt; no plain pp / tg tests
            return f + ["-p", "0", "-n", "0", "-gp", "%d,%s" % (depth, n_gen)]
        return f + (["-d", str(depth)] if depth > 0 else [])

    def describe(self, depth):
        return " ".join(self.flags(depth, "N")) or "(defaults)"

    def run(self, model, a, depth):
        """(pp, tg) tokens/s at `depth`; pp None where the build cannot
        measure it there."""
        cmd = [self.binary, "-m", model, "-t", str(a.threads), "-r", str(a.reps),
               "-o", "jsonl" if self.has_jsonl else "json"]
        gp = depth > 0 and not self.has_depth
        if not gp:  # (llama-bench appends repeated -p / -n values, never replaces them)
            cmd += ["-p", str(a.n_prompt), "-n", str(a.n_gen)]
        cmd += self.flags(depth, a.n_gen)
        pp = tg = None
        for j in bench_records(run_checked(cmd, env=self.env)):
            n_p, n_g = j.get("n_prompt", 0), j.get("n_gen", 0)
            if gp:
                if n_p == depth and n_g == a.n_gen:
                    tg = j["avg_ts"]
            elif j.get("n_depth", 0) != depth:
                continue
            elif n_p > 0 and n_g == 0:
                pp = j["avg_ts"]
            elif n_g > 0 and n_p == 0:
                tg = j["avg_ts"]
        return pp, tg


ROOT = os.path.dirname(os.path.dirname(HERE))
SUITE_SYNTH = [("1b", "q4_0"), ("110m", "q4_0"), ("110m", "q8_0"), ("110m", "f16")]
SUITE_REAL = ["qwen2.5-coder-0.5b-instruct-q4_k_m", "qwen2.5-coder-1.5b-instruct-q4_k_m"]


def suite_models(d):
    """The issue's models: synthetic ones written into d, real ones fetched."""
    os.makedirs(d, exist_ok=True)
    out = []
    for shape, typ in SUITE_SYNTH:
        path = os.path.join(d, "s%s-%s.gguf" % (shape, typ))
        if not os.path.exists(path):
            run_checked([sys.executable, os.path.join(ROOT, "tools", "gen_synthetic_model.py"),
                         "--shape", shape, "--type", typ, "--ctx", "32768", "-o", path])
        out.append(path)
    for name in SUITE_REAL:
        run_checked([os.path.join(ROOT, "scripts", "get-model"), name])
        out.append(os.path.join(ROOT, "models", name + ".gguf"))
    return out


def cpu_line():
    """The CPU's model name and the vector extensions cairn's kernels choose by."""
    name, flags = "?", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k.strip() == "model name" and name == "?":
                    name = v.strip()
                elif k.strip() == "flags" and not flags:
                    flags = set(v.split())
    except OSError:
        pass
    want = ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
            "avx512vbmi", "avx_vnni", "amx_tile"]
    return "%s (%d logical CPUs; %s)" % (name, os.cpu_count() or 0,
                                          " ".join(f for f in want if f in flags) or "no AVX2")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*")
    ap.add_argument("--suite", metavar="DIR", default=None,
                    help="the decode issue's models (synthetic ones written into DIR)")
    ap.add_argument("--cairn", default=os.path.join(os.getcwd(), "build", "cairn"))
    ap.add_argument("--llama", default=os.environ.get("LLAMA_CPP_BUILD"),
                    help="llama.cpp build dir (containing bin/llama-bench)")
    ap.add_argument("--ik", default=None,
                    help="ik_llama.cpp build dir (containing bin/llama-bench); run with -rtr 1 -fa 1")
    ap.add_argument("--llama-fa", default=None,
                    help="llama.cpp's -fa at every depth (default: 1 at depth > 0, its own "
                         "default at depth 0)")
    ap.add_argument("--no-amx", action="store_true", help="run llama-bench under the no-AMX shim")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-d", "--depth", default="0",
                    help="comma-separated depths, tokens of context before each test (default 0)")
    ap.add_argument("-r", "--reps", type=int, default=3, help="repetitions inside each run")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per model")
    a = ap.parse_args()
    if a.suite:
        a.models = suite_models(a.suite) + a.models
    if not a.models:
        sys.exit("no models (give paths, or --suite DIR)")
    try:
        depths = [int(x) for x in a.depth.split(",") if x.strip()]
    except ValueError:
        sys.exit("-d needs comma-separated integers, got %r" % a.depth)
    if not depths or min(depths) < 0:
        sys.exit("-d needs non-negative depths, got %r" % a.depth)
    show_depth = depths != [0]

    rows = []
    kernels = None
    # 1-minute load average after each round: on a small machine another
    # busy process shows up here and explains an outlier.
    load_start, loads = os.getloadavg()[0], []
    with tempfile.TemporaryDirectory() as d:
        shim = build_shim(d) if ((a.llama or a.ik) and a.no_amx) else None
        peers = []
        if a.llama:
            peers.append(Peer("llama.cpp", find_llama_bench(a.llama, "--llama"), shim, False,
                              a.llama_fa))
        if a.ik:
            peers.append(Peer("ik_llama.cpp", find_llama_bench(a.ik, "--ik"), shim, True, None))
        for p in peers:
            if p.ik and not p.has_depth and max(depths) > 0:
                print("ik_llama.cpp's llama-bench has no -d: its tg at depth is -gp D,%d, "
                      "and it has no pp at depth" % a.n_gen, file=sys.stderr)
        for model in a.models:
            res = {dp: {"cairn": ([], []), "bpt": [], "bw": [],
                        **{p.label: ([], []) for p in peers}} for dp in depths}
            for r in range(a.rounds):
                for dp in depths:
                    cell = res[dp]
                    j = run_cairn(a.cairn, model, a, dp)
                    kernels = j.get("kernels") or kernels
                    cell["cairn"][0].append(j["pp"]); cell["cairn"][1].append(j["tg"])
                    cell["bpt"].append(j["bytes_per_token"])
                    if j.get("read_bw_gbps"):
                        cell["bw"].append(j["read_bw_gbps"] * 1e9)
                    line = "cairn pp %.1f tg %.1f" % (j["pp"], j["tg"])
                    for p in peers:
                        pp, tg = p.run(model, a, dp)
                        cell[p.label][0].append(pp); cell[p.label][1].append(tg)
                        line += " | %s pp %s tg %s" % (p.label, fmt(pp), fmt(tg))
                    loads.append(os.getloadavg()[0])
                    print("%s d%d round %d: %s (read bw %s GB/s, load %.2f)" % (
                        os.path.basename(model), dp, r + 1, line,
                        fmt(j.get("read_bw_gbps")), loads[-1]), file=sys.stderr)
            for dp in depths:
                cell = res[dp]
                med = lambda v: statistics.median(x for x in v if x is not None) \
                    if any(x is not None for x in v) else None
                row = {"model": os.path.basename(model), "depth": dp,
                       "bpt": med(cell["bpt"]), "bw": med(cell["bw"]),
                       "pp": {"cairn": med(cell["cairn"][0])}, "tg": {"cairn": med(cell["cairn"][1])}}
                for p in peers:
                    row["pp"][p.label] = med(cell[p.label][0])
                    row["tg"][p.label] = med(cell[p.label][1])
                rows.append(row)

    print("\nCPU: " + cpu_line())
    print_table(a, rows, peers, show_depth)
    bws = [r["bw"] for r in rows if r["bw"]]
    print("\n%d threads, medians of %d alternating rounds (each %d reps); read bandwidth %s "
          "(cairn bench's probe in the same runs; per model and depth: %s GB/s)" % (
              a.threads, a.rounds, a.reps,
              "%.1f GB/s" % (statistics.median(bws) / 1e9) if bws else "not measured",
              ", ".join("%.1f" % (b / 1e9) for b in bws) if bws else "-"))
    if kernels:
        print("cairn ran: %s" % kernels)
    for p in peers:
        print("%s ran with: %s" % (p.label, "; ".join(
            "d%d: %s" % (dp, p.describe(dp)) for dp in depths)))
    print("load average (1 min): %.2f at the start, %.2f median and %.2f max after the rounds"
          % (load_start, statistics.median(loads) if loads else 0.0, max(loads) if loads else 0.0))


def fmt(v, spec="%.1f"):
    return spec % v if v is not None else "-"


def print_table(a, rows, peers, show_depth):
    names = ["cairn"] + [p.label for p in peers]
    short = {"cairn": "cairn", "llama.cpp": "llama.cpp", "ik_llama.cpp": "ik"}
    ratio = lambda x, y: "%.2f" % (x / y) if x is not None and y else "-"
    head = ["model"] + (["depth"] if show_depth else [])
    for kind, n in (("pp", a.n_prompt), ("tg", a.n_gen)):
        head += ["%s %s%d" % (short[e], kind, n) for e in names]
        head += ["cairn/%s" % short[p.label] for p in peers]
    head += ["MB/token"] + ["%s tg / read bw" % short[e] for e in names]
    print("\n| " + " | ".join(head) + " |")
    print("|---|" + "---:|" * (len(head) - 1))
    for r in rows:
        cells = [r["model"]] + (["%d" % r["depth"]] if show_depth else [])
        for kind in ("pp", "tg"):
            cells += [fmt(r[kind][e]) for e in names]
            cells += [ratio(r[kind]["cairn"], r[kind][p.label]) for p in peers]
        cells.append(fmt(r["bpt"] / 1e6 if r["bpt"] else None))
        for e in names:
            tg = r["tg"][e]
            cells.append("%.0f%%" % (100 * tg * r["bpt"] / r["bw"]) if tg and r["bw"] else "-")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
