"""The routers people deploy in front of inference replicas, started as real
processes for tests/route/test_routers.py and bench/scale/bench_routers.py:
vllm-router (round_robin, cache_aware, kv_aware with cairn's KV events) and
sglang-router (cache_aware), both PyPI wheels (Rust binaries), and cairn's
own `cairn route`.

have_routers() installs the wheels with pip when they are missing and says
why not when that fails (the callers skip). Every router is waited for until
it answers through to a replica, and ended with SIGKILL (they hold no state a
test needs afterwards).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

from harness import free_port  # noqa: F401  (the callers use routers.free_port too)

VLLM_ROUTER = "vllm-router==0.1.17"
SGLANG_ROUTER = "sglang-router==0.3.2"
GUARD_S = 300


def have_routers():
    """None when vllm-router and sglang-router can be run, else why not."""
    if shutil.which("vllm-router") and shutil.which("sglang-router"):
        return None
    p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", VLLM_ROUTER, SGLANG_ROUTER],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return "pip could not install %s and %s: %s" % (VLLM_ROUTER, SGLANG_ROUTER,
                                                        p.stderr.strip().splitlines()[-1:])
    if not (shutil.which("vllm-router") and shutil.which("sglang-router")):
        return "vllm-router / sglang-router installed but not on PATH"
    return None


def tokenizer_folder(model, out):
    """tools/ckpt's tokenizer folder for `model` (tokenizer.json and the
    chat template): what vllm-router's kv_aware is given as the model."""
    if not os.path.exists(os.path.join(out, "tokenizer_config.json")):
        root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
        subprocess.run([sys.executable, os.path.join(root, "tools", "ckpt", "gguf_to_hf.py"), model,
                        out, "--tokenizer-only"], check=True, capture_output=True)
    return out


class RouterProcess:
    """A router process, its log kept in `log_path`; .port is its HTTP port."""

    name = "router"

    def __init__(self, argv, port, log_path):
        self.port = port
        self.log_path = log_path
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + GUARD_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited; see {log_path}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"{self.name} did not start; see {log_path}")
            time.sleep(0.2)

    def kill(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self.log.close()

    stop = kill


class VllmRouter(RouterProcess):
    """vllm-router --policy POLICY over `workers` (http URLs). kv_aware needs
    `events` {worker url: (pub endpoint, replay endpoint or None)} and
    `tokenizer` (a folder)."""

    name = "vllm-router"

    def __init__(self, policy, workers, log_path, events=None, tokenizer=None, block_size=16):
        port = free_port()
        argv = ["vllm-router", "--host", "127.0.0.1", "--port", str(port),
                "--prometheus-port", str(free_port()), "--policy", policy,
                "--health-check-interval-secs", "1", "--worker-urls", *workers]
        if policy == "kv_aware":
            argv += ["--kv-event-model", tokenizer, "--kv-event-block-size", str(block_size)]
            for url, (pub, replay) in events.items():
                argv += ["--kv-event-source", f"{url}={pub}"]
                if replay:
                    argv += ["--kv-event-replay-source", f"{url}={replay}"]
        super().__init__(argv, port, log_path)


class SglangRouter(RouterProcess):
    name = "sglang-router"

    def __init__(self, workers, log_path, policy="cache_aware"):
        port = free_port()
        argv = ["sglang-router", "launch", "--host", "127.0.0.1", "--port", str(port),
                "--prometheus-port", str(free_port()), "--policy", policy,
                "--worker-urls", *workers]
        super().__init__(argv, port, log_path)


class CairnRoute(RouterProcess):
    """`cairn route --policy cache` over replicas that publish their page
    events to `redis_url` (started with --shared-cache URL --shared-write
    none --replica-id rN)."""

    name = "cairn route"

    def __init__(self, binary, model, replicas, redis_url, log_path, ids=None):
        port = free_port()
        argv = [binary, "route", "-m", model, "--http-port", str(port), "--shared-cache", redis_url,
                "--policy", "cache"]
        for i, r in enumerate(replicas):
            rid = ids[i] if ids else f"r{i}"
            argv += ["--replica", f"http={r.http_host}:{r.http_port},rpc={r.host}:{r.port},id={rid}"]
        super().__init__(argv, port, log_path)


def post_json(port, path, body, timeout=GUARD_S):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def metrics(port, headers=None):
    """A replica's /metrics as {series: value}."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers or {})
    with urllib.request.urlopen(req, timeout=60) as r:
        out = {}
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out


def computed_tokens(ports):
    """Prompt tokens the replicas at `ports` computed: looked up minus served
    from the cache, from their /metrics."""
    total = 0
    for port in ports:
        m = metrics(port)
        total += m["cairn_prefix_cache_queries_total"] - m["cairn_prefix_cache_hits_total"]
    return int(total)


def rag_requests(words, n_docs, n_asks, doc_words, seed=1, offset=101):
    """n_docs documents x n_asks questions, interleaved (doc 0 q0, doc 1 q0,
    ...), as chat requests: the document in the system message."""
    import random
    docs = []
    for i in range(n_docs):
        start = (i * 7919 + offset) % (len(words) - doc_words)
        docs.append(f"Document {i}.\n" + " ".join(words[start:start + doc_words]))
    order = [(d, q) for q in range(n_asks) for d in range(n_docs)]
    rest = order[n_docs:]
    random.Random(seed).shuffle(rest)
    order = order[:n_docs] + rest  # the first round opens each document
    return [(d, {"messages": [{"role": "system", "content": docs[d]},
                              {"role": "user", "content": f"Question {q}: what happened to "
                                                          f"{words[(q * 13 + d) % len(words)]}?"}],
                 "max_tokens": 4, "temperature": 0}) for d, q in order]


def floor_tokens(port, requests):
    """What a perfect cache computes for `requests` in order: each prompt's
    tokens past its longest common prefix with any earlier prompt (the
    token ids from a replica's /v1/chat/completions/render)."""
    seen, total = [], 0
    for _, body in requests:
        ids = post_json(port, "/v1/chat/completions/render", body)["token_ids"]
        best = 0
        for s in seen:
            k = 0
            while k < len(s) and k < len(ids) and s[k] == ids[k]:
                k += 1
            best = max(best, k)
        total += len(ids) - best
        seen.append(ids)
    return total


def run_concurrent(port, bodies, path="/v1/chat/completions"):
    """Every body at once; (replies, failures). `port`: one port, or a list
    of them (body i goes to port[i % len(port)])."""
    ports = port if isinstance(port, (list, tuple)) else [port]
    replies, failures, lock = [None] * len(bodies), [], threading.Lock()

    def one(i, body):
        try:
            r = post_json(ports[i % len(ports)], path, body)
            with lock:
                replies[i] = r
        except Exception as e:  # noqa: BLE001 - counted, reported by the caller
            with lock:
                failures.append(repr(e))
    threads = [threading.Thread(target=one, args=(i, b)) for i, b in enumerate(bodies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return replies, failures
