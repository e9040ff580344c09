#!/usr/bin/env bash
# bench/gpu/run.sh — the CUDA backend on one GPU, end to end, in one go,
# within DEADLINE (480 s; about 6 minutes on an H100 or H200, the models
# written while cairn builds; bench/gpu/README.md has the stage budget):
#   0. the environment: bench/gpu/env.sh points the build at the device kit
#      (.gpu-kit, made by bench/gpu/kit.sh) when it is there, and finds the
#      CUDA runtime and cuBLAS;
#   1. configure and build cairn with CUDA (fails unless CMake says
#      "CUDA backend ON"), warnings not errors (CAIRN_WERROR=OFF: the image's
#      compiler was never tried; they are counted and kept in build.log),
#      then check that every library cairn links resolves;
#   2. run the `gpu` tests (CUDA against the CPU backend) with
#      CAIRN_GPU_REQUIRED=1 (on this machine a skipped GPU test is a
#      failure), CTEST_JOBS at a time, stopped after CTEST_CAP seconds so the
#      benchmarks always get their time; gpu_sample makes
#      CAIRN_GPU_SAMPLE_DRAWS draws per setting (2048: a check, not a census);
#   3. write two synthetic Llama-3-8B-shaped models with random weights
#      (dim 4096, LAYERS layers, 32 heads, 8 KV heads, ffn 14336, vocab
#      128256, Llama 3 rope_freqs) with tools/gen_synthetic_model.py, one BF16
#      (16 GB at 32 layers) and one Q4_K (4.2 GB), in the background from
#      the start, unless already there;
#   4. gpu_bench on each: device copy bandwidth, then prefill and decode
#      throughput at each batch after CONTEXT tokens (1280: decode rows see
#      more than 1,024 keys, so decode attention takes the split-KV path),
#      each with its fraction of the memory-bandwidth roofline
#      (bench/gpu/gpu_bench.c explains the arithmetic); the figures also go
#      to bench-q4_k.json / bench-bf16.json;
#   5. bench/gpu/serve_check.py, when the tree has it: the server's answers
#      on CUDA against the CPU reference.
#   Steps 4 and 5 run most important first among those that can start:
#   BF16 eager as soon as its model is written, Q4_K eager and serve_check
#   while it is being written, and the Q4_K rerun with CUDA graphs last,
#   only when time is left;
#   6. one summary table, printed last whatever happened (a failed, cut or
#      interrupted stage included): each stage, ok/FAILED/cut/not run, its
#      seconds on run.sh's own clock against its budget, its key figures.
#
# Environment: OUT (logs and JSON go there; default BUILD_DIR), BUILD_DIR
# (default build-gpu), MODEL_DIR (default $BUILD_DIR/bench-models), MODEL /
# MODEL_Q4K (benchmark these GGUFs instead; written as above when absent),
# Q4K=0 (no Q4_K run), LAYERS (default 32; 8 writes a quarter of the bytes),
# CUDACXX (nvcc), JOBS, WERROR (CAIRN_WERROR, default OFF), BATCHES (default
# 1,8,32), GEN (decode steps, 32), PROMPT (prefill tokens, 512), CONTEXT
# (tokens per sequence before decoding, 1280), SKIP_TESTS=1, CTEST_ARGS
# (default "-L gpu"), CTEST_JOBS (default 4), CTEST_CAP (seconds, 150),
# CAIRN_GPU_SAMPLE_DRAWS (default 2048), DEADLINE (seconds, default 480:
# every stage's time limit is cut to what is left of it, so the summary
# always comes), CAIRN_KIT (the kit folder).
# CUDA=OFF is the kit's dry run (bench/gpu/kit_dryrun.sh): configure without
# CUDA, build everything (or TARGETS), run CTEST_ARGS, no benchmark; there
# skipped tests are allowed (ALLOW_SKIPS=1 is its default) and ctest is not
# capped.
# Exit status: non-zero when any stage FAILED (a failed test does not stop
# the benchmarks, so one run reports both); a stage cut for time is not a
# failure, and the summary says so.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-gpu}"
LOG_DIR="${OUT:-$BUILD_DIR}"
MODEL_DIR="${MODEL_DIR:-$BUILD_DIR/bench-models}"
JOBS="${JOBS:-$(nproc)}"
# Three decode batches, not four, on a first run: B=64 costs the most and
# tells the least new (gpu_bench --batches takes any list).
BATCHES="${BATCHES:-1,8,32}"
GEN="${GEN:-32}"
PROMPT="${PROMPT:-512}"
# Decode attention splits rows with more than 1,024 visible keys into chunks
# of 256 (kernels/cuda/cuda_attention.cu): 1280 is five whole chunks, and the
# steps after it add a partial sixth, so the run measures the split path
# (and its short last chunk), not only the row kernel a context of 128 gets.
CONTEXT="${CONTEXT:-1280}"
LAYERS="${LAYERS:-32}"
DEADLINE="${DEADLINE:-480}"
WERROR="${WERROR:-OFF}"
CUDA="${CUDA:-ON}"
if [ "$CUDA" = OFF ]; then
    TARGETS="${TARGETS:-}"
    CTEST_ARGS="${CTEST_ARGS:--LE gpu}"
    CTEST_JOBS="${CTEST_JOBS:-$JOBS}"
    CTEST_CAP="${CTEST_CAP:-$DEADLINE}"
    ALLOW_SKIPS="${ALLOW_SKIPS:-1}"
else
    TARGETS="${TARGETS:-cairn gpu_ops gpu_model gpu_transfer gpu_graph gpu_sample gpu_bench}"
    CTEST_ARGS="${CTEST_ARGS:--L gpu}"
    # The gpu tests are bound by their CPU references, not by the GPU, and
    # the largest takes a 4.6 GiB pool: 4 at a time fit any of these GPUs.
    CTEST_JOBS="${CTEST_JOBS:-4}"
    CTEST_CAP="${CTEST_CAP:-150}"
    ALLOW_SKIPS="${ALLOW_SKIPS:-0}"
fi
# gpu_sample's twin draws on the CPU: 2048 per setting is the check-sized
# count (tests/gpu/test_gpu_sample.c says what it proves), ~1 minute.
export CAIRN_GPU_SAMPLE_DRAWS="${CAIRN_GPU_SAMPLE_DRAWS:-2048}"
# A CAIRN_GPU_TEST_BACKEND=cpu left in the caller's environment would run
# every gpu test on the scalar CPU harness, and they would all pass.
unset CAIRN_GPU_TEST_BACKEND
mkdir -p "$BUILD_DIR" "$LOG_DIR"
status=0
t_start=$(date +%s)
now() { echo $(( $(date +%s) - t_start )); }
stamp() { echo "== [$(now)s] $*"; }

# ---- the stage clock and the summary -------------------------------------------
# Each stage's budget in seconds: estimates for an H100 or H200 machine with
# 16 cores (bench/gpu/README.md, "Stage budget"), printed beside what the
# stage took. The model writers run in the background; their rows count
# only the time spent waiting for them.
declare -A BUDGET=([environment]=10 [configure]=40 [build]=45 [ctest]=90
                   ["model q4_k"]=0 ["bench q4_k"]=45 [serve_check]=50
                   ["model bf16"]=0 ["bench bf16"]=30 ["bench q4_k-graphs"]=45)
if [ "$CUDA" = OFF ]; then
    PLAN=(environment configure build ctest bench serve_check)
else
    PLAN=(environment configure build ctest "bench bf16" "bench q4_k" serve_check "bench q4_k-graphs")
    [ "${Q4K:-1}" = 0 ] && PLAN=(environment configure build ctest "bench bf16" serve_check)
fi
[ "${SKIP_TESTS:-0}" = 1 ] && BUDGET[ctest]=0
S_NAME=() S_RES=() S_SECS=() S_NOTE=()
n_warn=""
stopped=""
record() { # stage result(ok|FAILED|skipped|cut|absent|not run) seconds figures
    S_NAME+=("$1") S_RES+=("$2") S_SECS+=("$3") S_NOTE+=("$4")
    [ "$2" = FAILED ] && status=1
    stamp "$1: $2${4:+ — $4}"
}
recorded() { # stage -> 0 when the summary already has it
    local n
    for n in "${S_NAME[@]}"; do [ "$n" = "$1" ] && return 0; done
    return 1
}
bench_ok() { # stage -> 0 when the summary has it as ok
    local i
    for i in "${!S_NAME[@]}"; do [ "${S_NAME[$i]}" = "$1" ] && [ "${S_RES[$i]}" = ok ] && return 0; done
    return 1
}
CUR_STEP="" CUR_T0=0
begin() { CUR_STEP="$1" CUR_T0=$(date +%s); stamp "$1"; }
took() { echo $(( $(date +%s) - CUR_T0 )); }
exit_why() { # rc -> words
    case "$1" in 124) echo "timed out (its limit, within DEADLINE ${DEADLINE}s)" ;; *) echo "exit $1" ;; esac
}
# seconds a stage may still run: what is left of DEADLINE, less a margin for
# the summary and RESERVE seconds kept for a more important stage after it,
# capped at the stage's own limit
limit() { # [cap [reserve]]
    local left=$(( DEADLINE - $(now) - 15 - ${2:-0} ))
    [ $# -gt 0 ] && [ "$1" -lt "$left" ] && left=$1
    [ "$left" -lt 1 ] && left=1
    echo "$left"
}
# room STAGE NEED [RESERVE]: 0 when the stage still has NEED seconds; else it
# is recorded as cut, so the summary says why it did not run
room() {
    local left=$(( DEADLINE - $(now) - 15 - ${3:-0} )) kept=""
    [ "$left" -ge "$2" ] && return 0
    [ "${3:-0}" -gt 0 ] && kept=" (${3}s more kept for bench bf16)"
    record "$1" cut 0 "$(( left > 0 ? left : 0 ))s left of DEADLINE ${DEADLINE}s$kept, it needs ~${2}s"
    return 1
}
summary() {
    local i name total sum=0 budget_sum=0 n_cut=0 b verdict why="not reached"
    total=$(now)
    [ -n "$stopped" ] && why="run.sh was stopped ($stopped) before it"
    # every planned stage gets a row, those never reached too
    for name in "${PLAN[@]}"; do
        recorded "$name" || { S_NAME+=("$name") S_RES+=("not run") S_SECS+=(0) S_NOTE+=("$why"); }
    done
    for i in "${!S_NAME[@]}"; do
        sum=$(( sum + S_SECS[i] ))
        budget_sum=$(( budget_sum + ${BUDGET[${S_NAME[$i]}]:-0} ))
        [ "${S_RES[$i]}" = cut ] && n_cut=$(( n_cut + 1 ))
    done
    verdict="all ok"
    [ "$n_cut" -gt 0 ] && verdict="ok, $n_cut cut for time"
    [ "$status" -ne 0 ] && verdict=FAILED
    echo
    echo "== summary: $verdict in ${total}s of DEADLINE ${DEADLINE}s (logs and JSON in $LOG_DIR)"
    printf '%-18s %-8s %5s %6s  %s\n' stage result secs budget figures
    for i in "${!S_NAME[@]}"; do
        b=${BUDGET[${S_NAME[$i]}]:-}
        printf '%-18s %-8s %5s %6s  %s\n' "${S_NAME[$i]}" "${S_RES[$i]}" "${S_SECS[$i]}" "${b:--}" "${S_NOTE[$i]}"
    done
    printf '%-18s %-8s %5s %6s  %s\n' "total" "" "$sum" "$budget_sum" \
        "stages on run.sh's clock; wall ${total}s; compiler warnings: ${n_warn:-not built} (build.log)"
}
W_PIDS=()
on_exit() {
    local rc=$?
    trap - EXIT TERM INT
    [ ${#W_PIDS[@]} -gt 0 ] && kill "${W_PIDS[@]}" 2>/dev/null
    if [ -n "$CUR_STEP" ]; then
        record "$CUR_STEP" FAILED "$(took)" "interrupted (${stopped:-exit $rc})"
    fi
    summary | tee "$LOG_DIR/summary.txt"
    exit "$status"
}
trap on_exit EXIT
# A TERM (an outer timeout) is handled at the latest when the stage running
# ends: bash waits for a foreground pipeline, and each stage's own timeout
# is in a process group of its own (its tee, killed with run.sh's group,
# often ends it at once). Every stage ends within DEADLINE, so an outer
# timeout of DEADLINE + 80 s (README) is only a backstop.
trap 'status=1; stopped="a signal: an outer timeout?"; exit 124' TERM INT

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
            -DCAIRN_WERROR="$WERROR" -DPython3_EXECUTABLE="$(command -v python3)")
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
timeout "$(limit 180)" cmake "${cmake_args[@]}" 2>&1 | tee "$LOG_DIR/configure.log"
rc=${PIPESTATUS[0]}
cuda_line="$(grep -o 'CUDA backend [A-Z]*' "$LOG_DIR/configure.log" | tail -1)"
if [ "$rc" -ne 0 ]; then
    CUR_STEP=""; record configure FAILED "$(took)" \
        "cmake $(exit_why "$rc"): $(grep -m1 -A2 'CMake Error' "$LOG_DIR/configure.log" | tr -s ' \n' ' ' | cut -c1-120)"
elif [ "$CUDA" != OFF ] && [ "$cuda_line" != "CUDA backend ON" ]; then
    grep -i cuda "$LOG_DIR/configure.log"
    CUR_STEP=""; record configure FAILED "$(took)" "CMake did not enable the CUDA backend"
else
    CUR_STEP=""; record configure ok "$(took)" "$cuda_line; ${CMAKE_GENERATOR:-Unix Makefiles}; CAIRN_WERROR=$WERROR"

    begin build
    # shellcheck disable=SC2086 # TARGETS is a list of names
    timeout "$(limit)" cmake --build "$BUILD_DIR" -j "$JOBS" ${TARGETS:+--target $TARGETS} 2>&1 |
        tee "$LOG_DIR/build.log"
    rc=${PIPESTATUS[0]}
    # gcc's "file:line:col: warning:", nvcc's "file(line): warning #NNN-D:",
    # "nvcc warning :", "ptxas warning :", ld's "warning:": counted, and the
    # distinct ones listed, to fix after the run (only the objects built in
    # this run: a rebuild on a warm machine shows fewer)
    n_warn=$(grep -cE '(^|[^[:alnum:]_-])warning( #[0-9A-Za-z-]+)? ?:' "$LOG_DIR/build.log")
    if [ "$n_warn" -gt 0 ]; then
        echo "== $n_warn compiler warning lines; the distinct ones:"
        grep -E '(^|[^[:alnum:]_-])warning( #[0-9A-Za-z-]+)? ?:' "$LOG_DIR/build.log" |
            sort | uniq -c | sort -rn | head -20
    fi
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
            CUR_STEP=""; record build ok "$(took)" "${TARGETS:-all targets}; $from_kit libraries from the kit; $n_warn warnings"
        fi
    fi
fi

# ---- 2. tests ------------------------------------------------------------------
if [ "$built" = 1 ] && [ "${SKIP_TESTS:-0}" != 1 ]; then
    begin ctest
    # ctest's --stop-time (a time of day) ends the tests still running at the
    # cap and starts no more, and ctest still prints its own summary; the
    # outer timeout is only the backstop. -j runs the costliest first
    # (COST in tests/gpu/tests.cmake).
    cap=$(limit "$CTEST_CAP")
    stop_at=$(date -d "@$(( $(date +%s) + cap ))" '+%H:%M:%S')
    # shellcheck disable=SC2086 # CTEST_ARGS is a list of arguments
    n_listed=$(ctest --test-dir "$BUILD_DIR" $CTEST_ARGS -N 2>/dev/null | sed -n 's/^Total Tests: //p')
    stamp "ctest $CTEST_ARGS: ${n_listed:-?} tests, $CTEST_JOBS at a time, stopped at $stop_at (${cap}s)"
    # shellcheck disable=SC2086 # CTEST_ARGS is a list of arguments
    CAIRN_GPU_REQUIRED=1 timeout "$(( cap + 10 ))" ctest --test-dir "$BUILD_DIR" $CTEST_ARGS \
        -j "$CTEST_JOBS" --stop-time "$stop_at" --no-tests=error --output-on-failure --timeout 300 2>&1 |
        tee "$LOG_DIR/ctest.log"
    rc=${PIPESTATUS[0]}
    line="$(grep -E 'tests passed, [0-9]+ tests? failed out of' "$LOG_DIR/ctest.log" | tail -1)"
    n_total=$(echo "$line" | sed -n 's/.*out of \([0-9]*\).*/\1/p')
    n_failed=$(echo "$line" | sed -n 's/.*passed, \([0-9]*\) tests\{0,1\} failed.*/\1/p')
    n_skipped=$(grep -c -- '\*\*\*Skipped' "$LOG_DIR/ctest.log")
    figs="$CTEST_ARGS -j $CTEST_JOBS: $(( ${n_total:-0} - ${n_failed:-0} - n_skipped ))/${n_total:-?} passed, ${n_failed:-?} failed, $n_skipped skipped"
    # tests ctest never started (the stop time came first) are in no count
    if [ -n "$n_listed" ] && [ -n "$n_total" ] && [ "$n_total" -lt "$n_listed" ]; then
        figs="$figs, $(( n_listed - n_total )) of $n_listed not started (CTEST_CAP ${CTEST_CAP}s)"
    fi
    grep -q 'The stop time has been passed' "$LOG_DIR/ctest.log" && figs="$figs; stopped at the cap"
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
else
    record ctest skipped 0 "no build"
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
model_ready() { # tag -> 0 when its model needs no more waiting (there, written, or failed)
    local pid="${W_PID[$1]:-}"
    [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null
}
wait_model() { # tag -> 0 when the model is there; records the writer's row
    local tag="$1" path="${W_PATH[$1]}" pid="${W_PID[$1]:-}" waited t0 rc=0 wrote
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
        W_PID[$tag]=""
        CUR_STEP=""; record "model $tag" FAILED "$waited" "not written within DEADLINE (LAYERS=8 writes a quarter)"
        return 1
    fi
    wait "$pid" || rc=$?
    W_PID[$tag]=""
    CUR_STEP=""
    wrote="$(cat "$path.secs" 2>/dev/null || echo '?')"
    if [ "$rc" -ne 0 ] || [ ! -s "$path" ]; then
        tail -5 "$LOG_DIR/generate-$tag.log" >&2
        rm -f "$path.tmp"
        record "model $tag" FAILED "$waited" \
            "gen_synthetic_model.py exit $rc after ${wrote}s (generate-$tag.log)"
        return 1
    fi
    # the seconds column counts the wait only: the writing overlapped
    # the stages before it
    record "model $tag" ok "$waited" \
        "$(( $(stat -c %s "$path") / 1000000 )) MB, $LAYERS layers, written in ${wrote}s in the background"
}
bench_figures() { # log -> "copy X GB/s; prefill P tok/s (f); decode bB T (f), ..."
    local log="$1" bw pf dec
    bw=$(sed -n 's/.*copy bandwidth \([0-9.]*\) GB\/s.*/\1/p' "$log" | head -1)
    pf=$(sed -n 's/^prefill *[0-9]* tokens: *\([0-9.]*\) tok\/s.* at \([0-9.]*\) of roofline.*/\1 tok\/s (\2)/p' "$log" | head -1)
    dec=$(sed -n 's/^decode batch *\([0-9]*\): *\([0-9.]*\) tok\/s.*; \([0-9.]*\) of roofline.*/b\1 \2 (\3)/p' "$log" | tr '\n' ',' | sed 's/,$//; s/,/, /g')
    echo "copy ${bw:-?} GB/s; tok/s (fraction of roofline): prefill ${pf:-?}; decode ${dec:-?}"
}
run_bench() { # tag graphs(0|1) cap reserve: with graphs=1, decode steps run as CUDA graphs
    local model="${W_PATH[$1]}" tag="$1" graphs="$2" cap="$3" reserve="$4" rc
    [ "$graphs" = 1 ] && tag="$1-graphs"
    local json="$LOG_DIR/bench-$tag.json" log="$LOG_DIR/bench-$tag.log"
    local args=("$model" --device cuda --batches "$BATCHES" --gen "$GEN" --prompt "$PROMPT"
                --context "$CONTEXT" --reps 3)
    [ "$bench_json_arg" = 1 ] && args+=(--json "$json")
    room "bench $tag" 30 "$reserve" || return 0
    begin "bench $tag"
    stamp "gpu_bench $tag: prefill $PROMPT tokens; decode batches $BATCHES, $GEN steps after $CONTEXT tokens"
    CAIRN_CUDA_GRAPHS=$graphs timeout "$(limit "$cap" "$reserve")" "$BENCH" "${args[@]}" 2>&1 | tee "$log"
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
bench_model() { # tag graphs(0|1) cap reserve: wait for its model, then benchmark it
    local tag="$1" name="bench $1"
    [ "$2" = 1 ] && name="bench $1-graphs"
    [ -n "${W_PATH[$tag]:-}" ] || return 0
    if [ "$built" != 1 ]; then
        record "$name" skipped 0 "no build"
    elif [ ! -x "$BENCH" ]; then
        record "$name" skipped 0 "gpu_bench was not built"
    elif ! recorded "model $tag" && ! wait_model "$tag"; then
        record "$name" skipped 0 "no model"
    elif [ "$2" = 1 ] && ! bench_ok "bench $tag"; then
        record "$name" skipped 0 "no eager run to compare with"
    else
        run_bench "$tag" "$2" "$3" "$4"
    fi
    return 0
}

# ---- 5. the server on CUDA against the CPU -------------------------------------
SERVE_CHECK="$ROOT/bench/gpu/serve_check.py"
serve_check() { # reserve
    local rc last cap
    if [ ! -f "$SERVE_CHECK" ]; then
        record serve_check absent 0 "bench/gpu/serve_check.py is not in this tree"
        return
    elif [ "$CUDA" = OFF ] || [ "$built" != 1 ]; then
        record serve_check skipped 0 "$([ "$CUDA" = OFF ] && echo CUDA=OFF || echo "no build")"
        return
    fi
    room serve_check 45 "$1" || return 0
    begin serve_check
    # serve_check's own --time-limit stays 15 s inside the timeout it runs
    # under: past its limit it kills the servers and still prints its table
    # (otherwise the timeout would kill it first, and the summary would say
    # only "exit 124")
    cap=$(limit 120 "$1")
    stamp "serve_check: --time-limit $(( cap - 15 ))s, under a timeout of ${cap}s"
    PYTHONUNBUFFERED=1 timeout "$cap" python3 "$SERVE_CHECK" --cairn "$BUILD_DIR/cairn" \
        --model "$ROOT/models/stories260K.gguf" --device cuda --reference-device cpu \
        --time-limit "$(( cap - 15 ))" --out "$LOG_DIR/serve" 2>&1 | tee "$LOG_DIR/serve.log"
    rc=${PIPESTATUS[0]}
    last="$(grep -v '^[[:space:]]*$' "$LOG_DIR/serve.log" | tail -1 | cut -c1-100)"
    CUR_STEP=""
    if [ "$rc" -ne 0 ]; then
        record serve_check FAILED "$(took)" "$(exit_why "$rc"): $last"
    else
        record serve_check ok "$(took)" "$last"
    fi
}

# The order: BF16 eager is the measurement that matters most, and runs as
# soon as its model is written (minutes: usually during ctest); Q4_K eager
# (its model takes under a minute) and serve_check fill the wait, keeping
# BF16_RESERVE seconds of DEADLINE for it while it is still to come. The Q4_K
# rerun with CUDA graphs comes last, only when time is left.
BF16_RESERVE=45
if [ "$CUDA" = OFF ]; then
    record bench skipped 0 "CUDA=OFF"
    serve_check 0
else
    todo=(bf16)
    [ -n "${W_PATH[q4_k]:-}" ] && todo+=(q4_k)
    todo+=(serve)
    while [ ${#todo[@]} -gt 0 ]; do
        pick="" t0=$(date +%s) slept=0
        while :; do # the most important one that can start now
            for t in "${todo[@]}"; do
                if [ "$t" = serve ] || model_ready "$t"; then pick=$t; break; fi
            done
            [ -n "$pick" ] && break
            # nothing can: wait for whichever model comes first (wait_model
            # gives up on a writer that would not finish in time)
            [ "$(limit)" -gt 60 ] || { pick=${todo[0]}; break; }
            sleep 2
            slept=1
        done
        [ "$slept" = 1 ] &&
            record "waiting" ok $(( $(date +%s) - t0 )) "for a model writer, nothing else left to run"
        reserve=0
        [ "$pick" != bf16 ] && [[ " ${todo[*]} " == *" bf16 "* ]] && reserve=$BF16_RESERVE
        case "$pick" in
            serve) serve_check "$reserve" ;;
            bf16) bench_model bf16 0 150 0 ;;
            q4_k) bench_model q4_k 0 120 "$reserve" ;;
        esac
        rest=()
        for t in "${todo[@]}"; do [ "$t" = "$pick" ] || rest+=("$t"); done
        todo=(${rest[@]+"${rest[@]}"})
    done
    # the same with decode steps as CUDA graphs (off by default until this
    # says they are equal, gpu_graph, and faster)
    bench_model q4_k 1 120 0
fi
# on_exit prints the summary and exits with $status
