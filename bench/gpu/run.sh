#!/usr/bin/env bash
# bench/gpu/run.sh — the CUDA backend on one GPU, end to end, in one go
# (about 6 minutes on an H200; the models are written while cairn builds):
#   0. the environment: bench/gpu/env.sh points the build at the device kit
#      (.gpu-kit, made by bench/gpu/kit.sh) when it is there, and finds the
#      CUDA runtime and cuBLAS;
#   1. configure and build cairn with CUDA (fails unless CMake says
#      "CUDA backend ON"), then check that every library cairn links resolves;
#   2. run the `gpu` tests (CUDA against the CPU backend) with
#      CAIRN_GPU_REQUIRED=1: on this machine a skipped GPU test is a failure;
#   3. write two synthetic Llama-3-8B-shaped models with random weights
#      (dim 4096, LAYERS layers, 32 heads, 8 KV heads, ffn 14336, vocab
#      128256, Llama 3 rope_freqs) with tools/gen_synthetic_model.py, one BF16
#      (16 GB at 32 layers) and one Q4_K (4.2 GB), unless already there;
#   4. gpu_bench on each (Q4_K first: it is written in under a minute, and
#      is measured while the BF16 one is still being written): device copy
#      bandwidth, then prefill and decode throughput at each batch, each with
#      its fraction of the memory-bandwidth roofline (bench/gpu/gpu_bench.c
#      explains the arithmetic); the figures also go to bench-q4_k.json /
#      bench-bf16.json;
#   5. bench/gpu/serve_check.py, when the tree has it (before the BF16
#      benchmark, for the same reason): the server's answers on CUDA against
#      the CPU reference;
#   6. one summary table, printed last: each step, ok/FAILED, its seconds and
#      its key figures.
#
# Environment: OUT (logs and JSON go there; default BUILD_DIR), BUILD_DIR
# (default build-gpu), MODEL_DIR (default $BUILD_DIR/bench-models), MODEL /
# MODEL_Q4K (benchmark these GGUFs instead; written as above when absent),
# Q4K=0 (no Q4_K run), LAYERS (default 32; 8 writes a quarter of the bytes),
# CUDACXX (nvcc), JOBS, BATCHES (default 1,8,32,64), GEN (decode steps, 32),
# PROMPT (prefill tokens, 512), CONTEXT (tokens per sequence before decoding,
# 128), SKIP_TESTS=1, CTEST_ARGS (default "-L gpu"), CTEST_JOBS (default 1),
# DEADLINE (seconds, default 480: every step's time limit is cut to what is
# left of it, so the summary always comes), CAIRN_KIT (the kit folder).
# CUDA=OFF is the kit's dry run (bench/gpu/kit_dryrun.sh): configure without
# CUDA, build everything (or TARGETS), run CTEST_ARGS, no benchmark; there
# skipped tests are allowed (ALLOW_SKIPS=1 is its default).
# Exit status: non-zero when any step FAILED (a failed test does not stop the
# benchmark, so one run reports both).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-gpu}"
LOG_DIR="${OUT:-$BUILD_DIR}"
MODEL_DIR="${MODEL_DIR:-$BUILD_DIR/bench-models}"
JOBS="${JOBS:-$(nproc)}"
BATCHES="${BATCHES:-1,8,32,64}"
GEN="${GEN:-32}"
PROMPT="${PROMPT:-512}"
CONTEXT="${CONTEXT:-128}"
LAYERS="${LAYERS:-32}"
DEADLINE="${DEADLINE:-480}"
CUDA="${CUDA:-ON}"
if [ "$CUDA" = OFF ]; then
    TARGETS="${TARGETS:-}"
    CTEST_ARGS="${CTEST_ARGS:--LE gpu}"
    CTEST_JOBS="${CTEST_JOBS:-$JOBS}"
    ALLOW_SKIPS="${ALLOW_SKIPS:-1}"
else
    TARGETS="${TARGETS:-cairn gpu_ops gpu_model gpu_transfer gpu_graph gpu_sample gpu_bench}"
    CTEST_ARGS="${CTEST_ARGS:--L gpu}"
    CTEST_JOBS="${CTEST_JOBS:-1}"
    ALLOW_SKIPS="${ALLOW_SKIPS:-0}"
fi
mkdir -p "$BUILD_DIR" "$LOG_DIR"
status=0
t_start=$(date +%s)
now() { echo $(( $(date +%s) - t_start )); }
stamp() { echo "== [$(now)s] $*"; }

# ---- the summary ---------------------------------------------------------------
S_NAME=() S_RES=() S_SECS=() S_NOTE=()
record() { # step result(ok|FAILED|skipped|absent) seconds figures
    S_NAME+=("$1") S_RES+=("$2") S_SECS+=("$3") S_NOTE+=("$4")
    [ "$2" = FAILED ] && status=1
    stamp "$1: $2${4:+ — $4}"
}
CUR_STEP="" CUR_T0=0
begin() { CUR_STEP="$1" CUR_T0=$(date +%s); stamp "$1"; }
took() { echo $(( $(date +%s) - CUR_T0 )); }
exit_why() { # rc -> words
    case "$1" in 124) echo "timed out (DEADLINE ${DEADLINE}s)" ;; *) echo "exit $1" ;; esac
}
# seconds a step may still run: what is left of DEADLINE, less a margin for
# the steps after it and the summary, capped at the step's own limit
limit() { # [cap]
    local left=$(( DEADLINE - $(now) - 15 ))
    [ $# -gt 0 ] && [ "$1" -lt "$left" ] && left=$1
    [ "$left" -lt 1 ] && left=1
    echo "$left"
}
summary() {
    local i total
    total=$(now)
    echo
    echo "== summary: $([ "$status" -eq 0 ] && echo "all ok" || echo "FAILED") in ${total}s" \
         "(logs and JSON in $LOG_DIR)"
    printf '%-16s %-8s %5s  %s\n' step result secs figures
    for i in "${!S_NAME[@]}"; do
        printf '%-16s %-8s %5s  %s\n' "${S_NAME[$i]}" "${S_RES[$i]}" "${S_SECS[$i]}" "${S_NOTE[$i]}"
    done
}
W_PIDS=()
on_exit() {
    local rc=$?
    trap - EXIT TERM INT
    [ ${#W_PIDS[@]} -gt 0 ] && kill "${W_PIDS[@]}" 2>/dev/null
    if [ -n "$CUR_STEP" ]; then
        record "$CUR_STEP" FAILED "$(took)" "interrupted (exit $rc)"
    fi
    summary | tee "$LOG_DIR/summary.txt"
    exit "$status"
}
trap on_exit EXIT
trap 'status=1; exit 124' TERM INT

# ---- 0. environment ----------------------------------------------------------
begin environment
# shellcheck source=bench/gpu/env.sh
. "$ROOT/bench/gpu/env.sh"
grep -E '^(PRETTY_NAME)=' /etc/os-release 2>/dev/null
for tool in gcc cmake ninja make pkg-config python3 nvcc nvidia-smi; do
    [ "$tool" = pkg-config ] && [ -n "${PKG_CONFIG:-}" ] && { printf "  %-10s %s\n" "$tool" "$PKG_CONFIG"; continue; }
    printf '  %-10s %s\n' "$tool" "$(command -v "$tool" || echo -)"
done
cmake --version | head -1
gpu_name="no GPU seen"
if [ "$CUDA" != OFF ]; then
    NVCC="${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
    "$NVCC" --version 2>/dev/null | tail -2
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.memory --format=csv 2>&1 | head -5
        gpu_name="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
    fi
fi
python3 -c 'import sys, numpy; print("  python", sys.version.split()[0], "numpy", numpy.__version__)' ||
    echo "run.sh: python3 has no numpy: the synthetic models cannot be written" >&2
env_figs="$gpu_name; $(echo "$CAIRN_ENV_NOTES" | grep -o 'libcublas.so.13: [^(]*' | head -1)"
CUR_STEP=""; record environment ok "$(took)" "$env_figs"

# ---- 3 (early). the models, written in the background while cairn builds ----
# gen_model TAG TYPE PATH: starts the writer unless PATH is there; the writer
# leaves PATH only when complete, and its seconds in PATH.secs.
declare -A W_PID W_PATH
gen_model() {
    local tag="$1" type="$2" path="$3"
    W_PATH[$tag]="$path"
    [ -s "$path" ] && return
    mkdir -p "$(dirname "$path")"
    stamp "writing $path in the background ($type, $LAYERS layers)"
    (
        t0=$(date +%s)
        python3 "$ROOT/tools/gen_synthetic_model.py" --type "$type" --dim 4096 --layers "$LAYERS" \
            --heads 32 --kv-heads 8 --ffn 14336 --vocab 128256 --ctx 8192 --rope-freqs \
            -o "$path.tmp" && mv "$path.tmp" "$path"
        rc=$?
        echo $(( $(date +%s) - t0 )) > "$path.secs"
        exit $rc
    ) > "$LOG_DIR/generate-$tag.log" 2>&1 &
    W_PID[$tag]=$!
    W_PIDS+=($!)
}
shape="llama3-8b"
[ "$LAYERS" != 32 ] && shape="llama3-8b-L$LAYERS"
if [ "$CUDA" != OFF ]; then
    gen_model bf16 BF16 "${MODEL:-$MODEL_DIR/synthetic-$shape-bf16.gguf}"
    [ "${Q4K:-1}" != 0 ] && gen_model q4_k Q4_K "${MODEL_Q4K:-$MODEL_DIR/synthetic-$shape-q4_k.gguf}"
fi

# ---- 1. configure + build ----------------------------------------------------------
begin configure
cmake_args=(-S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
            -DPython3_EXECUTABLE="$(command -v python3)")
[ -n "${PKG_CONFIG:-}" ] && cmake_args+=(-DPKG_CONFIG_EXECUTABLE="$PKG_CONFIG")
built=0
if [ "$CUDA" = OFF ]; then
    cmake_args+=(-DCAIRN_CUDA=OFF)
elif [ ! -x "$NVCC" ]; then
    CUR_STEP=""; record configure FAILED "$(took)" "nvcc not found (set CUDACXX)"
    exit 1
else
    cmake_args+=(-DCMAKE_CUDA_COMPILER="$NVCC")
fi
timeout "$(limit 240)" cmake "${cmake_args[@]}" 2>&1 | tee "$LOG_DIR/configure.log"
rc=${PIPESTATUS[0]}
cuda_line="$(grep -o 'CUDA backend [A-Z]*' "$LOG_DIR/configure.log" | tail -1)"
if [ "$rc" -ne 0 ]; then
    CUR_STEP=""; record configure FAILED "$(took)" \
        "cmake $(exit_why "$rc"): $(grep -m1 -A2 'CMake Error' "$LOG_DIR/configure.log" | tr -s ' \n' ' ' | cut -c1-120)"
elif [ "$CUDA" != OFF ] && [ "$cuda_line" != "CUDA backend ON" ]; then
    grep -i cuda "$LOG_DIR/configure.log"
    CUR_STEP=""; record configure FAILED "$(took)" "CMake did not enable the CUDA backend"
else
    CUR_STEP=""; record configure ok "$(took)" "$cuda_line; ${CMAKE_GENERATOR:-Unix Makefiles}"

    begin build
    # shellcheck disable=SC2086 # TARGETS is a list of names
    timeout "$(limit)" cmake --build "$BUILD_DIR" -j "$JOBS" ${TARGETS:+--target $TARGETS} 2>&1 |
        tee "$LOG_DIR/build.log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then
        CUR_STEP=""; record build FAILED "$(took)" \
            "$(exit_why "$rc"): $(grep -m1 -E 'error|FAILED' "$LOG_DIR/build.log" | cut -c1-120)"
    else
        # every library cairn links must resolve here, kit ones through the
        # build tree's RUNPATH (env.sh does not touch LD_LIBRARY_PATH for them)
        missing="$(ldd "$BUILD_DIR/cairn" 2>&1 | grep 'not found' | awk '{print $1}' | tr '\n' ' ')"
        from_kit=0
        [ -n "$CAIRN_KIT_SYSROOT" ] &&
            from_kit=$(ldd "$BUILD_DIR/cairn" | grep -c "$CAIRN_KIT_SYSROOT")
        if [ -n "$missing" ]; then
            CUR_STEP=""; record build FAILED "$(took)" "cairn cannot load: $missing"
        else
            built=1
            CUR_STEP=""; record build ok "$(took)" "${TARGETS:-all targets}; $from_kit libraries from the kit"
        fi
    fi
fi

# ---- 2. tests ------------------------------------------------------------------
if [ "$built" = 1 ] && [ "${SKIP_TESTS:-0}" != 1 ]; then
    begin ctest
    # shellcheck disable=SC2086 # CTEST_ARGS is a list of arguments
    CAIRN_GPU_REQUIRED=1 timeout "$(limit)" ctest --test-dir "$BUILD_DIR" $CTEST_ARGS \
        -j "$CTEST_JOBS" --no-tests=error --output-on-failure --timeout 300 2>&1 |
        tee "$LOG_DIR/ctest.log"
    rc=${PIPESTATUS[0]}
    line="$(grep -E 'tests passed, [0-9]+ tests? failed out of' "$LOG_DIR/ctest.log" | tail -1)"
    n_total=$(echo "$line" | sed -n 's/.*out of \([0-9]*\).*/\1/p')
    n_failed=$(echo "$line" | sed -n 's/.*passed, \([0-9]*\) tests\{0,1\} failed.*/\1/p')
    n_skipped=$(grep -c -- '\*\*\*Skipped' "$LOG_DIR/ctest.log")
    figs="$CTEST_ARGS: $(( ${n_total:-0} - ${n_failed:-0} - n_skipped ))/${n_total:-?} passed, ${n_failed:-?} failed, $n_skipped skipped"
    if [ "$rc" -ne 0 ] || [ -z "$line" ]; then
        CUR_STEP=""; record ctest FAILED "$(took)" "$figs ($(exit_why "$rc"))"
    elif [ "$n_skipped" -gt 0 ] && [ "$ALLOW_SKIPS" != 1 ]; then
        grep -- '\*\*\*Skipped' "$LOG_DIR/ctest.log"
        CUR_STEP=""; record ctest FAILED "$(took)" "$figs: a GPU machine must skip none"
    else
        CUR_STEP=""; record ctest ok "$(took)" "$figs"
    fi
elif [ "${SKIP_TESTS:-0}" = 1 ]; then
    record ctest skipped 0 "SKIP_TESTS=1"
fi

# ---- 4. the benchmarks ---------------------------------------------------------
BENCH="$BUILD_DIR/tests/gpu_bench"
# gpu_bench learned --json PATH later than it learned to print a JSON line;
# both kinds work: without --json, the last JSON line of its output is kept.
bench_json_arg=0
if [ -x "$BENCH" ]; then
    bench_usage="$("$BENCH" 2>&1 || true)"   # no arguments: the usage line
    if grep -q -- '--json' <<<"$bench_usage" || grep -aq -- '--json' "$BENCH"; then
        bench_json_arg=1
    fi
fi
wait_model() { # tag -> 0 when the model is there; records the writer's step
    local tag="$1" path="${W_PATH[$1]}" pid="${W_PID[$1]:-}" waited t0 rc=0
    if [ -z "$pid" ]; then
        record "model $tag" ok 0 "$(basename "$path") was there"
        return 0
    fi
    t0=$(date +%s)
    CUR_STEP="model $tag" CUR_T0=$t0
    stamp "waiting for $path"
    while kill -0 "$pid" 2>/dev/null && [ "$(limit)" -gt 60 ]; do sleep 2; done
    waited=$(( $(date +%s) - t0 ))
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null
        CUR_STEP=""; record "model $tag" FAILED "$waited" "not written within DEADLINE (LAYERS=8 writes a quarter)"
        return 1
    fi
    wait "$pid" || rc=$?
    W_PID[$tag]=""
    CUR_STEP=""
    if [ "$rc" -ne 0 ] || [ ! -s "$path" ]; then
        tail -5 "$LOG_DIR/generate-$tag.log" >&2
        rm -f "$path.tmp"
        record "model $tag" FAILED "$(cat "$path.secs" 2>/dev/null || echo "$waited")" \
            "gen_synthetic_model.py exit $rc (generate-$tag.log)"
        return 1
    fi
    record "model $tag" ok "$(cat "$path.secs" 2>/dev/null || echo "$waited")" \
        "$(( $(stat -c %s "$path") / 1000000 )) MB, $LAYERS layers; waited ${waited}s"
}
bench_figures() { # log -> "copy X GB/s; prefill P tok/s (f); decode bB T (f), ..."
    local log="$1" bw pf dec
    bw=$(sed -n 's/.*copy bandwidth \([0-9.]*\) GB\/s.*/\1/p' "$log" | head -1)
    pf=$(sed -n 's/^prefill *[0-9]* tokens: *\([0-9.]*\) tok\/s.* at \([0-9.]*\) of roofline.*/\1 tok\/s (\2)/p' "$log" | head -1)
    dec=$(sed -n 's/^decode batch *\([0-9]*\): *\([0-9.]*\) tok\/s.*; \([0-9.]*\) of roofline.*/b\1 \2 (\3)/p' "$log" | tr '\n' ',' | sed 's/,$//; s/,/, /g')
    echo "copy ${bw:-?} GB/s; tok/s (fraction of roofline): prefill ${pf:-?}; decode ${dec:-?}"
}
run_bench() { # tag [graphs]: with "graphs", decode steps run as CUDA graphs
    local model="${W_PATH[$1]}" tag="$1${2:+-$2}" rc
    local json="$LOG_DIR/bench-$tag.json" log="$LOG_DIR/bench-$tag.log"
    local graphs=0
    [ "${2:-}" = graphs ] && graphs=1
    local args=("$model" --device cuda --batches "$BATCHES" --gen "$GEN" --prompt "$PROMPT"
                --context "$CONTEXT" --reps 3)
    [ "$bench_json_arg" = 1 ] && args+=(--json "$json")
    begin "bench $tag"
    stamp "gpu_bench $tag: prefill $PROMPT tokens; decode batches $BATCHES, $GEN steps after $CONTEXT tokens"
    CAIRN_CUDA_GRAPHS=$graphs timeout "$(limit 240)" "$BENCH" "${args[@]}" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    [ "$bench_json_arg" = 1 ] || grep '^{' "$log" | tail -1 > "$json"
    [ -s "$json" ] || rm -f "$json"
    CUR_STEP=""
    if [ "$rc" -ne 0 ]; then
        record "bench $tag" FAILED "$(took)" "$(exit_why "$rc"): $(grep -m1 'gpu_bench:' "$log" | cut -c1-100)"
    else
        record "bench $tag" ok "$(took)" "$(bench_figures "$log")"
    fi
}
bench_model() { # tag [graphs]: wait for its model, then benchmark it (again with graphs)
    local tag="$1"
    [ -n "${W_PATH[$tag]:-}" ] || return 0
    if ! wait_model "$tag"; then
        record "bench $tag" skipped 0 "no model"
    elif [ ! -x "$BENCH" ]; then
        record "bench $tag" skipped 0 "gpu_bench was not built"
    else
        run_bench "$tag"
        # the same with decode steps as CUDA graphs (off by default until
        # this says they are equal, gpu_graph, and faster)
        [ "${2:-}" = graphs ] && [ "$(limit)" -gt 90 ] && run_bench "$tag" graphs
    fi
    return 0
}

# ---- 5. the server on CUDA against the CPU -------------------------------------
SERVE_CHECK="$ROOT/bench/gpu/serve_check.py"
serve_check() {
    local rc last
    if [ ! -f "$SERVE_CHECK" ]; then
        record serve_check absent 0 "bench/gpu/serve_check.py is not in this tree"
        return
    elif [ "$CUDA" = OFF ] || [ "$built" != 1 ]; then
        record serve_check skipped 0 "$([ "$CUDA" = OFF ] && echo CUDA=OFF || echo "no build")"
        return
    fi
    begin serve_check
    timeout "$(limit 180)" python3 "$SERVE_CHECK" --cairn "$BUILD_DIR/cairn" \
        --model "$ROOT/models/stories260K.gguf" --device cuda --reference-device cpu \
        --out "$LOG_DIR/serve" 2>&1 | tee "$LOG_DIR/serve.log"
    rc=${PIPESTATUS[0]}
    last="$(grep -v '^[[:space:]]*$' "$LOG_DIR/serve.log" | tail -1 | cut -c1-100)"
    CUR_STEP=""
    if [ "$rc" -ne 0 ]; then
        record serve_check FAILED "$(took)" "$(exit_why "$rc"): $last"
    else
        record serve_check ok "$(took)" "$last"
    fi
}

# The Q4_K model is written in well under a minute, the BF16 one takes
# minutes: Q4_K's benchmark and the server check run while BF16 is written.
if [ "$CUDA" = OFF ]; then
    record bench skipped 0 "CUDA=OFF"
    serve_check
else
    bench_model q4_k graphs
    serve_check
    bench_model bf16
fi
# on_exit prints the summary and exits with $status
