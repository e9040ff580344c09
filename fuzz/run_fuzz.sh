#!/usr/bin/env bash
# Build the libFuzzer targets and run each for FUZZ_SECONDS on a scratch copy
# of its committed seed corpus (fuzz/corpus/<target>) and of its past findings
# (fuzz/findings/<target>-*), so a run never grows the committed corpus. Fails
# when any target crashes, leaks, times out or breaks a property; the input
# that did it is kept under $FUZZ_BUILD_DIR/artifacts/<target>/ and the log next to it.
#
#   FUZZ_SECONDS   seconds per target (default 60)
#   FUZZ_TARGETS   which targets (default: rpc http_body gguf tokenizer disk_value ckpt)
#   FUZZ_BUILD_DIR build directory (default build-fuzz)
#   FUZZ_CC        the clang to use (default clang)
#   JOBS           build parallelism (default: nproc)
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${FUZZ_SECONDS:-60}
targets=${FUZZ_TARGETS:-"rpc http_body gguf tokenizer disk_value ckpt"}
build=${FUZZ_BUILD_DIR:-build-fuzz}
jobs=${JOBS:-$(nproc)}
cc=${FUZZ_CC:-clang}

if ! command -v "$cc" >/dev/null; then
    echo "fuzz: $cc not found (libFuzzer needs clang)" >&2
    exit 1
fi
cmake -S fuzz -B "$build" -DCMAKE_C_COMPILER="$cc" >/dev/null
build_targets=()
for t in $targets; do build_targets+=("fuzz_$t"); done
cmake --build "$build" -j "$jobs" --target "${build_targets[@]}"

work=$(mktemp -d "${TMPDIR:-/tmp}/cairn-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
failed=()
summary=""
export CAIRN_FUZZ_ROOT="$PWD"
for t in $targets; do
    corpus="$work/$t"
    mkdir -p "$corpus" "$build/artifacts/$t"
    cp fuzz/corpus/"$t"/* "$corpus"/
    # Inputs that once failed run first, with the seeds: a regression fails at once.
    for f in fuzz/findings/"$t"-*; do [ -e "$f" ] && cp "$f" "$corpus"/; done
    seeds=$(ls "$corpus" | wc -l)
    log="$build/artifacts/$t/last-run.log"
    echo "fuzz: $t for ${seconds}s ($seeds seeds)"
    rc=0
    # -timeout: one input taking over 10 s is a hang worth reporting.
    "./$build/fuzz_$t" "$corpus" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
        -print_final_stats=1 -artifact_prefix="$build/artifacts/$t/" >"$log" 2>&1 || rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
    line=$(printf '%-12s rc=%d runs=%s exec/s=%s %s corpus=%d->%d' "$t" "$rc" "${runs:-?}" \
        "${speed:-?}" "${cov:-cov: ?}" "$seeds" "$(ls "$corpus" | wc -l)")
    summary+="$line"$'\n'
    if [ "$rc" -ne 0 ]; then
        failed+=("$t")
        echo "fuzz: $t FAILED (log: $log)" >&2
        grep -E 'ERROR|property failed|SUMMARY|Test unit written' "$log" | head -20 >&2 || true
    fi
done
echo "fuzz summary (${seconds}s per target):"
printf '%s' "$summary"
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: failures in: ${failed[*]}" >&2
    exit 1
fi
