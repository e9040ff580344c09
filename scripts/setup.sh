#!/usr/bin/env bash
# Install what cairn needs to build (and, with --test, to run its tests) when
# it is missing. Safe to run repeatedly: it only acts on what is absent.
#   scripts/setup.sh          build dependencies (Debian packages)
#   scripts/setup.sh --test   also the test dependencies (Python packages)
set -euo pipefail

want_test=0
[ "${1:-}" = "--test" ] && want_test=1

debs=(build-essential cmake pkg-config liblmdb-dev lmdb-utils libuv1-dev libmsgpack-dev libzmq3-dev
      libxxhash-dev libcmocka-dev libpcre2-dev libjansson-dev libhttp-parser-dev libhiredis-dev
      python3 python3-pip)
# clang builds the libFuzzer targets (make fuzz); curl drives the HTTP facade's
# tests; redis-server is the shared cache tier the scale-out tests start
# (each its own, on loopback); only the test set needs them
# chromium and chromium-driver are the headless browser the web page's test
# drives (tests/web; never a browser downloaded at test time)
[ "$want_test" -eq 1 ] && debs+=(clang curl redis-server chromium chromium-driver)
missing=()
for p in "${debs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing Debian packages: ${missing[*]}" >&2
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >&2
fi

if [ $want_test -eq 1 ]; then
    # numpy and gguf (the reference GGUF reader in Python) drive the
    # independent forward-pass reference the tests compare against; msgpack
    # is what the Python client speaks to the server with.
    py=python3
    # jinja2 renders GGUF chat templates, the reference for cairn's own
    # formatters; openai is the client the HTTP facade must serve unchanged,
    # jsonschema checks its structured output; anthropic and openai-agents
    # (the Agents SDK) drive the Messages and Responses routes.
    # redis (redis-py) reads and damages what the replicas put in the shared
    # cache tier's Redis. tokenizers (Hugging Face's) is the reference for
    # the tokenizer.json the checkpoint tests write and cairn reads.
    # selenium drives the Debian chromium through chromedriver (tests/web).
    # prometheus_client's parser reads /metrics as Prometheus would.
    # pyzmq and msgspec read the KV events a replica publishes, decoded as
    # vLLM's own classes decode them (tests/kvevents).
    pypkgs=(numpy gguf msgpack jinja2 openai jsonschema anthropic openai-agents redis tokenizers
            selenium prometheus_client pyzmq msgspec)
    if ! $py -c "import numpy, gguf, msgpack, jinja2, openai, jsonschema, anthropic, agents, redis, tokenizers, selenium, prometheus_client, zmq, msgspec" \
        2>/dev/null; then
        echo "setup: installing Python packages: ${pypkgs[*]}" >&2
        $py -m pip install -q "${pypkgs[@]}" 2>/dev/null ||
            $py -m pip install -q --break-system-packages "${pypkgs[@]}"
    fi
fi

if [ $want_test -eq 1 ]; then
    # The clients agent frameworks use, each driven against the server by a
    # test of its own (tests/http/test_clients.py and the Responses /
    # Messages tests). A client that cannot be installed does not stop the
    # setup, but it is said loudly (pip's own error stays visible), and its
    # test exits 77: ctest reports it skipped and `make test` lists why.
    # (torch, for the Medusa .pt checkpoint test, is not installed: PyPI's
    # wheel brings gigabytes of CUDA libraries; medusa_heads_pt skips.)
    clients=(langchain-openai instructor anthropic openai-agents)
    if ! python3 -c "import langchain_openai, instructor, anthropic, agents" 2>/dev/null; then
        echo "setup: installing the client packages: ${clients[*]}" >&2
        python3 -m pip install -q "${clients[@]}" 2>/dev/null ||
            python3 -m pip install -q --break-system-packages "${clients[@]}" ||
            true
        missing_py=()
        for m in langchain_openai instructor anthropic agents; do
            python3 -c "import $m" 2>/dev/null || missing_py+=("$m")
        done
        if [ ${#missing_py[@]} -gt 0 ]; then
            echo "setup: ********************************************************************" >&2
            echo "setup: WARNING: these client packages could not be installed or imported:" >&2
            echo "setup:   ${missing_py[*]}" >&2
            echo "setup: the tests that drive them (http_clients, http_anthropic, http_agents)" >&2
            echo "setup: will be reported as skipped by ctest" >&2
            echo "setup: ********************************************************************" >&2
        fi
    fi
fi

if [ $want_test -eq 1 ]; then
    # The real instruct model (Qwen2.5-Coder-0.5B-Instruct Q4_K_M) that the
    # model-family tests run on. Without network the tests that need it skip,
    # saying why; everything else still runs.
    here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
    python3 "$here/get-model" >/dev/null ||
        echo "setup: WARNING: could not fetch the real model; tests that need it will skip" >&2
    # Gemma 3 270M, the sliding-window family (tests/http/test_gemma.py)
    python3 "$here/get-model" gemma3-270m-q4_k_m >/dev/null ||
        echo "setup: WARNING: could not fetch Gemma 3 270M; the tests that need it will skip" >&2
fi

if [ $want_test -eq 1 ]; then
    # The routers replicas are deployed behind (tests/route/test_routers.py,
    # bench/scale/bench_routers.py): PyPI wheels holding Rust binaries. The
    # test installs them itself when they are missing and skips, saying why,
    # when it cannot.
    if ! command -v vllm-router >/dev/null || ! command -v sglang-router >/dev/null; then
        echo "setup: installing vllm-router and sglang-router" >&2
        python3 -m pip install -q vllm-router==0.1.17 sglang-router==0.3.2 2>/dev/null ||
            python3 -m pip install -q --break-system-packages vllm-router==0.1.17 \
                sglang-router==0.3.2 ||
            echo "setup: WARNING: vllm-router / sglang-router not installed;" \
                 "route_routers_realmodel will be skipped" >&2
    fi
fi
