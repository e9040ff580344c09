#!/usr/bin/env bash
# Run tests under sanitizers (`make sanitize`, `make tsan`).
#
#   run_sanitizers.sh asan   configure $SAN_BUILD_DIR (default build-san) with
#                            CAIRN_SANITIZE=ON (ASan + UBSan), build everything,
#                            run the whole ctest suite but the tests labelled
#                            `realmodel` (generation on the 0.5B instruct
#                            model: minutes when instrumented, and the code
#                            they run is the same the bundled model's tests
#                            run) and `gpu`.
#   run_sanitizers.sh tsan   configure $TSAN_BUILD_DIR (default build-tsan) with
#                            CAIRN_TSAN=ON, build only what the server, protocol
#                            and session tests need (the store's *_asan tests
#                            cannot link with TSan), run those tests.
#
# Every sanitizer report, in a test binary or in a `cairn` process that a
# Python test started, is written to <build>/sanitizer-logs/; the run fails
# when a test fails or when that folder is not empty afterwards, so a report
# from a child process the test did not check still counts. ASan and UBSan
# stop at the first error; TSan reports every race it sees (the process then
# exits non-zero at the end).
#
#   SAN_BUILD_TYPE  CMake build type (default RelWithDebInfo)
#   JOBS            build and ctest parallelism (default: nproc)
#   CTEST_ARGS      extra ctest arguments (e.g. -R protocol)
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:?usage: run_sanitizers.sh asan|tsan}
jobs=${JOBS:-$(nproc)}
build_type=${SAN_BUILD_TYPE:-RelWithDebInfo}
read -r -a extra_ctest <<<"${CTEST_ARGS:-}"

case "$mode" in
asan)
    build=${SAN_BUILD_DIR:-build-san}
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE="$build_type" -DCAIRN_SANITIZE=ON -DCAIRN_TSAN=OFF >/dev/null
    cmake --build "$build" -j "$jobs"
    extra_ctest=(-LE "realmodel|gpu" "${extra_ctest[@]}")
    ;;
tsan)
    build=${TSAN_BUILD_DIR:-build-tsan}
    labels="session|protocol|server"
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE="$build_type" -DCAIRN_TSAN=ON -DCAIRN_SANITIZE=OFF >/dev/null
    # The executables those tests run: a C test is a target of the same name
    # (cairn_add_test); the Python tests drive `cairn`. ctest cannot list the
    # commands of executables that are not built yet, hence the names.
    mapfile -t targets < <(
        { cd "$build" && ctest -N -L "$labels" | sed -n 's/^ *Test *#[0-9]*: *//p'; } |
        sort -u | comm -12 - <(cmake --build "$build" --target help |
                                 sed -n 's/^\.\.\. \([^ ]*\).*/\1/p' | sort -u))
    targets+=(cairn)
    echo "sanitizers (tsan): building ${targets[*]}"
    cmake --build "$build" -j "$jobs" --target "${targets[@]}"
    extra_ctest=(-L "$labels" -LE "realmodel" "${extra_ctest[@]}")
    ;;
*)
    echo "usage: run_sanitizers.sh asan|tsan" >&2
    exit 2
    ;;
esac

logs="$PWD/$build/sanitizer-logs"
rm -rf "$logs"
mkdir -p "$logs"
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=1:log_path=$logs/asan"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:abort_on_error=1:log_path=$logs/ubsan"
export LSAN_OPTIONS="log_path=$logs/lsan"
export TSAN_OPTIONS="second_deadlock_stack=1:history_size=4:log_path=$logs/tsan:suppressions=$PWD/fuzz/tsan.supp"
# Tests that bound memory or time can tell they run instrumented.
export CAIRN_SANITIZER="$mode"

# TSan needs a predictable address-space layout; with high mmap ASLR entropy
# (vm.mmap_rnd_bits > 28) some kernels give "unexpected memory mapping".
# Turning ASLR off for the test run avoids it and is harmless elsewhere.
norandom=()
if [ "$mode" = tsan ] && setarch "$(uname -m)" -R true 2>/dev/null; then
    norandom=(setarch "$(uname -m)" -R)
fi

rc=0
start=$(date +%s)
(cd "$build" && "${norandom[@]}" ctest --output-on-failure -j "$jobs" "${extra_ctest[@]}") || rc=$?
echo "sanitizers ($mode): ctest finished in $(( $(date +%s) - start ))s, exit $rc"

reports=$(find "$logs" -type f | sort)
if [ -n "$reports" ]; then
    echo "sanitizers ($mode): reports in $logs:" >&2
    for f in $reports; do
        echo "---- $f" >&2
        head -60 "$f" >&2
    done
    rc=1
fi
exit "$rc"
