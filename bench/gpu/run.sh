#!/usr/bin/env bash
# bench/gpu/run.sh — the CUDA backend on one GPU, end to end, in one go
# (about 5 minutes on an H200; the model is written while cairn builds):
#   1. configure and build cairn with CUDA (fails unless CMake says
#      "CUDA backend ON");
#   2. run the `gpu` tests (CUDA against the CPU backend);
#   3. write a synthetic Llama-3-8B-shaped BF16 model with random weights
#      (dim 4096, 32 layers, 32 heads, 8 KV heads, ffn 14336, vocab 128256,
#      Llama 3 rope_freqs) with tools/gen_synthetic_model.py, unless it is
#      already there;
#   4. measure device copy bandwidth, then prefill and decode throughput at
#      batch 1, 8 and 32, each with its fraction of the memory-bandwidth
#      roofline (bench/gpu/gpu_bench.c explains the arithmetic).
#
# Environment: BUILD_DIR (default build-gpu), MODEL_DIR (default
# $BUILD_DIR/bench-models; the model is 16 GB), MODEL (benchmark this GGUF
# instead; written as above when absent), CUDACXX (nvcc), JOBS,
# BATCHES (default 1,8,32), GEN (decode steps, default 32), PROMPT (prefill
# tokens, default 512), CONTEXT (tokens per sequence before decoding,
# default 128), SKIP_TESTS=1 to go straight to the benchmark.
# Exit status: non-zero when the build, a test or the benchmark fails (the
# benchmark still runs after a failed test, so one run reports both).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-gpu}"
MODEL_DIR="${MODEL_DIR:-$BUILD_DIR/bench-models}"
JOBS="${JOBS:-$(nproc)}"
BATCHES="${BATCHES:-1,8,32}"
GEN="${GEN:-32}"
PROMPT="${PROMPT:-512}"
CONTEXT="${CONTEXT:-128}"
NVCC="${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
status=0
t_start=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t_start ))s] $*"; }

stamp "GPU"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.memory --format=csv 2>&1 | head -5 || true

# The 16 GB model takes a few minutes of numpy: write it in the background
# while cairn builds and the tests run.
MODEL="${MODEL:-$MODEL_DIR/synthetic-llama3-8b-bf16.gguf}"
GEN_PID=""
if [ ! -s "$MODEL" ]; then
    stamp "writing $MODEL in the background (16 GB of random BF16 weights)"
    mkdir -p "$MODEL_DIR"
    python3 "$ROOT/tools/gen_synthetic_model.py" --type BF16 --dim 4096 --layers 32 \
        --heads 32 --kv-heads 8 --ffn 14336 --vocab 128256 --ctx 8192 --rope-freqs \
        -o "$MODEL.tmp" > "$MODEL_DIR/generate.log" 2>&1 &
    GEN_PID=$!
    # an early exit must not leave the writer running
    trap '[ -n "$GEN_PID" ] && kill "$GEN_PID" 2>/dev/null' EXIT
fi

stamp "configure + build ($NVCC, $JOBS jobs)"
if [ ! -x "$NVCC" ]; then
    echo "run.sh: nvcc not found (set CUDACXX)" >&2
    exit 1
fi
mkdir -p "$BUILD_DIR"
cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$NVCC" \
    > "$BUILD_DIR/configure.log" 2>&1 || { cat "$BUILD_DIR/configure.log"; exit 1; }
if ! grep -q "CUDA backend ON" "$BUILD_DIR/configure.log"; then
    grep -i cuda "$BUILD_DIR/configure.log"
    echo "run.sh: CMake did not enable the CUDA backend" >&2
    exit 1
fi
cmake --build "$BUILD_DIR" -j "$JOBS" --target cairn gpu_ops gpu_model gpu_bench 2>&1 | tail -3
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "run.sh: build failed" >&2; exit 1; }

if [ "${SKIP_TESTS:-0}" != 1 ]; then
    stamp "ctest -L gpu"
    if ! ctest --test-dir "$BUILD_DIR" -L gpu --output-on-failure --timeout 300; then
        echo "run.sh: some gpu tests FAILED (continuing to the benchmark)" >&2
        status=1
    fi
fi

if [ -n "$GEN_PID" ]; then
    stamp "waiting for the model"
    if wait "$GEN_PID"; then
        GEN_PID=""
        mv "$MODEL.tmp" "$MODEL"
    else
        cat "$MODEL_DIR/generate.log" >&2
        echo "run.sh: could not write the synthetic model (needs python3 with numpy)" >&2
        rm -f "$MODEL.tmp"
        exit 1
    fi
fi
ls -l "$MODEL"

stamp "gpu_bench: prefill $PROMPT tokens; decode batches $BATCHES, $GEN steps after $CONTEXT tokens"
if ! "$BUILD_DIR/tests/gpu_bench" "$MODEL" --device cuda --batches "$BATCHES" --gen "$GEN" \
        --prompt "$PROMPT" --context "$CONTEXT" --reps 3; then
    echo "run.sh: benchmark FAILED" >&2
    status=1
fi
stamp "done (exit $status)"
exit $status
