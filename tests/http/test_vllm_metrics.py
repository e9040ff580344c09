#!/usr/bin/env python3
"""vLLM's metric names on /metrics (issue 42), through the real `cairn serve`
on the real instruct model (CAIRN_CHAT_MODEL: Qwen2.5-Coder-0.5B-Instruct),
read with prometheus_client's parser as Prometheus would: every vllm: name a
router or autoscaler reads is there with vLLM's type, labels (model_name,
engine) and histogram buckets; num_requests_running and kv_cache_usage_perc
follow a streaming request in flight and fall back after it; the prefix-cache
counters move by the prompt and cached tokens the usage object reports; the
latency histograms count one request per request and their sums fit inside
what the client measured. No timing thresholds. Skips (exit 77) when the
model file or prometheus_client is absent.

usage: test_vllm_metrics.py CAIRN_BIN [unittest args...]
"""
import json
import os
import sys
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import HANG_GUARD_S, SHORT_HANG_GUARD_S, Server  # noqa: E402

[CAIRN] = harness.take_argv("CAIRN_BIN", usage=__doc__)
CHAT_MODEL = os.environ.get("CAIRN_CHAT_MODEL", "")
if not os.path.exists(CHAT_MODEL):
    print(f"skipped: CAIRN_CHAT_MODEL ({CHAT_MODEL or 'unset'}) is absent; "
          "scripts/get-model fetches it")
    sys.exit(77)
try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    print("skipped: prometheus_client is not installed (scripts/setup.sh --test installs it)")
    sys.exit(77)

# A model name that needs escaping in a label value.
MODEL_NAME = 'Qwen/coder "0.5B" \\ test'

# vLLM's names (vllm/v1/metrics/loggers.py) as the parser names the family
# (a counter's family drops _total), and their types.
VLLM = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:gpu_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:gpu_prefix_cache_queries": "counter",
    "vllm:gpu_prefix_cache_hits": "counter",
    "vllm:num_preemptions": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:prompt_tokens_cached": "counter",
    "vllm:prompt_tokens_by_source": "counter",
    "vllm:prompt_tokens_cached_by_source": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:cache_config_info": "gauge",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:time_per_output_token_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram",
    "vllm:request_inference_time_seconds": "histogram",
}
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0]
REQUEST_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
BUCKETS = {
    "vllm:time_to_first_token_seconds": TTFT_BUCKETS,
    "vllm:inter_token_latency_seconds": ITL_BUCKETS,
    "vllm:time_per_output_token_seconds": ITL_BUCKETS,
    "vllm:request_time_per_output_token_seconds": ITL_BUCKETS,
    "vllm:e2e_request_latency_seconds": REQUEST_BUCKETS,
    "vllm:request_queue_time_seconds": REQUEST_BUCKETS,
    "vllm:request_prefill_time_seconds": REQUEST_BUCKETS,
    "vllm:request_decode_time_seconds": REQUEST_BUCKETS,
    "vllm:request_inference_time_seconds": REQUEST_BUCKETS,
}


class Scrape:
    """One /metrics answer, parsed by prometheus_client."""

    def __init__(self, url):
        with urllib.request.urlopen(url + "/metrics", timeout=SHORT_HANG_GUARD_S) as r:
            self.text = r.read().decode()
        self.families = {f.name: f for f in text_string_to_metric_families(self.text)}

    def value(self, sample_name, **labels):
        family = sample_name
        for suffix in ("_total", "_bucket", "_sum", "_count"):
            if sample_name.endswith(suffix) and sample_name[:-len(suffix)] in self.families:
                family = sample_name[:-len(suffix)]
        found = [s.value for s in self.families[family].samples
                 if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items())]
        if len(found) != 1:
            raise AssertionError(f"{sample_name}{labels}: {len(found)} samples")
        return found[0]


class VllmMetrics(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server(CAIRN, ["-m", CHAT_MODEL, "-c", "2048", "--kv-mem", "64M",
                                    "--model-name", MODEL_NAME],
                            http=True, start_timeout=SHORT_HANG_GUARD_S)
        cls.url = cls.server.http_url

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def scrape(self):
        return Scrape(self.url)

    def post(self, body):
        req = urllib.request.Request(self.url + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=HANG_GUARD_S) as r:
            return json.load(r)

    def stream(self, body):
        """POST a streaming completion; yields (seconds since sending, chunk)."""
        body = dict(body, stream=True, stream_options={"include_usage": True})
        req = urllib.request.Request(self.url + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        t0 = time.monotonic()
        with urllib.request.urlopen(req, timeout=HANG_GUARD_S) as r:
            for line in r:
                line = line.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                yield time.monotonic() - t0, json.loads(line[6:])

    def test_names_types_labels_buckets(self):
        self.post({"prompt": "def add(a, b):", "max_tokens": 4, "temperature": 0})
        m = self.scrape()
        for name, kind in VLLM.items():
            with self.subTest(name=name):
                self.assertIn(name, m.families)
                f = m.families[name]
                self.assertEqual(f.type, kind)
                self.assertTrue(f.samples)
                for s in f.samples:
                    self.assertEqual(s.labels.get("engine"), "0", s)
                    if name != "vllm:cache_config_info":  # vLLM gives it no model_name
                        self.assertEqual(s.labels.get("model_name"), MODEL_NAME, s)
        reasons = sorted(s.labels["finished_reason"]
                         for s in m.families["vllm:request_success"].samples)
        # vLLM 0.32 writes all five of its reasons, zeros included
        self.assertEqual(reasons, ["abort", "error", "length", "repetition", "stop"])
        self.assertEqual(m.value("vllm:request_success_total", finished_reason="repetition"), 0)
        self.assertEqual(sorted(s.labels["source"]
                                for s in m.families["vllm:prompt_tokens_by_source"].samples),
                         ["external_kv_transfer", "local_cache_hit", "local_compute"])
        self.assertEqual(sorted(s.labels["source"] for s in
                                m.families["vllm:prompt_tokens_cached_by_source"].samples),
                         ["device", "disk", "external_unspecified", "host", "p2p"])
        [info] = m.families["vllm:cache_config_info"].samples
        self.assertEqual(info.value, 1)
        self.assertEqual(info.labels["block_size"], "16")
        self.assertGreater(int(info.labels["num_gpu_blocks"]), 0)
        self.assertEqual(info.labels["enable_prefix_caching"], "True")
        for name, bounds in BUCKETS.items():
            with self.subTest(name=name):
                samples = m.families[name].samples
                buckets = [s for s in samples if s.name == name + "_bucket"]
                les = [s.labels["le"] for s in buckets]
                self.assertEqual(les[-1], "+Inf")
                self.assertEqual([float(x) for x in les[:-1]], bounds)
                # written as vLLM's prometheus_client writes them, so series of
                # cairn and vLLM replicas sum by le
                self.assertEqual(les[:-1], [repr(float(b)) for b in bounds])
                counts = [s.value for s in buckets]
                self.assertEqual(counts, sorted(counts), "buckets are cumulative")
                self.assertEqual(counts[-1], m.value(name + "_count"))
        self.assertGreaterEqual(m.value("vllm:time_to_first_token_seconds_count"), 1)
        self.assertGreaterEqual(m.value("vllm:generation_tokens_total"), 4)
        # the deprecated names carry the same values as their successors
        for old, new in (("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"),
                         ("vllm:gpu_prefix_cache_queries_total", "vllm:prefix_cache_queries_total"),
                         ("vllm:gpu_prefix_cache_hits_total", "vllm:prefix_cache_hits_total")):
            self.assertEqual(m.value(old), m.value(new))

    def test_running_and_kv_usage_follow_a_request(self):
        idle = self.scrape()
        self.assertEqual(idle.value("vllm:num_requests_running"), 0)
        self.assertEqual(idle.value("vllm:kv_cache_usage_perc"), 0)
        during = None
        finish = None
        for _, chunk in self.stream({"prompt": "Count from one to one hundred in words: one,",
                                     "max_tokens": 64, "ignore_eos": True,
                                     "temperature": 0}):
            if during is None and chunk.get("choices") and chunk["choices"][0].get("text"):
                during = self.scrape()  # in flight: more tokens are still to come
            if chunk.get("choices") and chunk["choices"][0].get("finish_reason"):
                finish = chunk["choices"][0]["finish_reason"]
        self.assertEqual(finish, "length")
        self.assertIsNotNone(during)
        self.assertGreaterEqual(during.value("vllm:num_requests_running"), 1)
        usage = during.value("vllm:kv_cache_usage_perc")
        self.assertGreater(usage, 0)
        self.assertLessEqual(usage, 1)
        # The request's pages stay in the prefix tree, reclaimable: as in vLLM
        # (cached blocks no request holds are free), they are not "in use".
        after = harness.poll(self.scrape, lambda m: m.value("vllm:num_requests_running") == 0)
        self.assertEqual(after.value("vllm:num_requests_waiting"), 0)
        self.assertEqual(after.value("vllm:kv_cache_usage_perc"), 0)
        self.assertGreater(after.value("cairn_kv_tree_pages", tier="device"), 0)

    def test_a_request_the_client_leaves_is_an_abort(self):
        before = self.scrape()
        chunks = self.stream({"prompt": "List the prime numbers:", "max_tokens": 400,
                              "ignore_eos": True, "temperature": 0})
        for _, chunk in chunks:
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                break
        chunks.close()  # hangs up mid-stream
        after = harness.poll(self.scrape, lambda m: m.value(
            "vllm:request_success_total", finished_reason="abort") > before.value(
            "vllm:request_success_total", finished_reason="abort"))
        self.assertEqual(after.value("vllm:request_success_total", finished_reason="abort")
                         - before.value("vllm:request_success_total", finished_reason="abort"), 1)
        self.assertEqual(after.value("vllm:request_success_total", finished_reason="length"),
                         before.value("vllm:request_success_total", finished_reason="length"))
        self.assertEqual(after.value("vllm:e2e_request_latency_seconds_count")
                         - before.value("vllm:e2e_request_latency_seconds_count"), 1)
        self.assertEqual(after.value("vllm:num_requests_running"), 0)

    def test_prefix_cache_counts_tokens(self):
        prompt = ("You are reviewing a pull request. The function below parses dates in "
                  "the ISO 8601 format and returns a tuple of integers. Explain what it "
                  "does wrong, briefly.\n\ndef parse(s):\n    y, m, d = s.split('-')\n"
                  "    return int(y), int(m), int(d)\n")
        before = self.scrape()
        first = self.post({"prompt": prompt, "max_tokens": 2, "temperature": 0})
        mid = self.scrape()
        second = self.post({"prompt": prompt, "max_tokens": 2, "temperature": 0})
        after = self.scrape()
        n = first["usage"]["prompt_tokens"]
        self.assertEqual(second["usage"]["prompt_tokens"], n)
        cached = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in (first, second)]
        self.assertGreater(cached[1], 0)
        self.assertLess(cached[1], n)  # at least one token is always computed
        for m0, m1, c in ((before, mid, cached[0]), (mid, after, cached[1])):
            self.assertEqual(m1.value("vllm:prefix_cache_queries_total")
                             - m0.value("vllm:prefix_cache_queries_total"), n)
            self.assertEqual(m1.value("vllm:prefix_cache_hits_total")
                             - m0.value("vllm:prefix_cache_hits_total"), c)
            self.assertEqual(m1.value("vllm:prompt_tokens_total")
                             - m0.value("vllm:prompt_tokens_total"), n)
            self.assertEqual(m1.value("vllm:generation_tokens_total")
                             - m0.value("vllm:generation_tokens_total"), 2)

    def test_latency_histograms_are_measured(self):
        names = ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                 "vllm:request_time_per_output_token_seconds",
                 "vllm:inter_token_latency_seconds", "vllm:request_queue_time_seconds",
                 "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
                 "vllm:request_inference_time_seconds")
        for round_ in range(2):
            before = self.scrape()
            first_text = last = None
            usage = None
            for t, chunk in self.stream({"prompt": f"# {round_}: a haiku about caches\n",
                                         "max_tokens": 6, "ignore_eos": True,
                                         "temperature": 0}):
                if first_text is None and chunk.get("choices") and chunk["choices"][0].get("text"):
                    first_text = t
                if chunk.get("usage"):
                    usage = chunk["usage"]
                last = t
            after = self.scrape()
            d = {n: (after.value(n + "_count") - before.value(n + "_count"),
                     after.value(n + "_sum") - before.value(n + "_sum")) for n in names}
            self.assertIsNotNone(first_text)
            self.assertEqual(usage["completion_tokens"], 6)
            for n in names:
                if n != "vllm:inter_token_latency_seconds":
                    self.assertEqual(d[n][0], 1, n)  # one observation per request
                self.assertGreaterEqual(d[n][1], 0, n)
            # the engine's first token comes before the client reads its text
            self.assertLessEqual(d["vllm:time_to_first_token_seconds"][1], first_text)
            self.assertGreater(d["vllm:time_to_first_token_seconds"][1], 0)
            self.assertLessEqual(d["vllm:e2e_request_latency_seconds"][1], last)
            self.assertGreaterEqual(d["vllm:e2e_request_latency_seconds"][1],
                                    d["vllm:time_to_first_token_seconds"][1])
            # 6 tokens: 5 steps after the first without speculation
            self.assertEqual(d["vllm:inter_token_latency_seconds"][0], 5)
            self.assertLessEqual(d["vllm:inter_token_latency_seconds"][1],
                                 d["vllm:request_decode_time_seconds"][1] + 1e-6)
            # one mean per request: its decode time over the 5 tokens after the first
            self.assertAlmostEqual(d["vllm:request_time_per_output_token_seconds"][1],
                                   d["vllm:request_decode_time_seconds"][1] / 5, delta=1e-6)
            self.assertAlmostEqual(d["vllm:request_inference_time_seconds"][1],
                                   d["vllm:request_prefill_time_seconds"][1]
                                   + d["vllm:request_decode_time_seconds"][1], delta=1e-6)
            self.assertEqual(after.value("vllm:request_success_total", finished_reason="length")
                             - before.value("vllm:request_success_total",
                                            finished_reason="length"), 1)

    def test_agrees_with_cairns_own_names(self):
        """Two requests, the second repeating the first's prompt: the vllm:
        names that have a cairn_ twin carry the twin's value, read from one
        page; at rest nothing runs or waits and no page is in use."""
        prompt = ("A lighthouse keeper writes in the log every night. Tonight the fog "
                  "is thick and the ships are late. Write the next line of the log:\n")
        before = self.scrape()
        for _ in range(2):
            self.post({"prompt": prompt, "max_tokens": 3, "temperature": 0})
        m = harness.poll(self.scrape, lambda m: m.value("vllm:num_requests_running") == 0)
        self.assertEqual(m.value("vllm:num_requests_running"), 0)
        self.assertEqual(m.value("vllm:num_requests_waiting"), 0)
        usage = m.value("vllm:kv_cache_usage_perc")
        self.assertGreaterEqual(usage, 0)
        self.assertLessEqual(usage, 1)
        # the second request found the first's prefix
        hits = m.value("vllm:prefix_cache_hits_total") - before.value("vllm:prefix_cache_hits_total")
        queries = (m.value("vllm:prefix_cache_queries_total")
                   - before.value("vllm:prefix_cache_queries_total"))
        self.assertGreater(hits, 0)
        self.assertGreaterEqual(queries, hits)
        self.assertEqual(m.value("vllm:time_to_first_token_seconds_count")
                         - before.value("vllm:time_to_first_token_seconds_count"), 2)
        self.assertEqual(m.value("vllm:request_time_per_output_token_seconds_count")
                         - before.value("vllm:request_time_per_output_token_seconds_count"), 2)
        twins = (("vllm:num_requests_running", "cairn_requests_running"),
                 ("vllm:num_requests_waiting", "cairn_requests_waiting"),
                 ("vllm:prefix_cache_queries_total", "cairn_prefix_cache_queries_total"),
                 ("vllm:prefix_cache_hits_total", "cairn_prefix_cache_hits_total"),
                 ("vllm:prompt_tokens_cached_total", "cairn_prefix_cache_hits_total"),
                 ("vllm:prompt_tokens_total", "cairn_prompt_tokens_total"),
                 ("vllm:generation_tokens_total", "cairn_generation_tokens_total"),
                 ("vllm:num_preemptions_total", "cairn_requests_paused_total"),
                 ("vllm:time_to_first_token_seconds_count",
                  "cairn_time_to_first_token_seconds_count"),
                 ("vllm:time_to_first_token_seconds_sum",
                  "cairn_time_to_first_token_seconds_sum"))
        for ours, theirs in twins:
            with self.subTest(name=ours):
                self.assertAlmostEqual(m.value(ours), m.value(theirs), delta=1e-6)
        # by source: every prompt token once; cached ones by the tier cairn names
        by_source = {s.labels["source"]: s.value
                     for s in m.families["vllm:prompt_tokens_by_source"].samples}
        self.assertEqual(sum(by_source.values()), m.value("vllm:prompt_tokens_total"))
        self.assertEqual(by_source["local_cache_hit"] + by_source["external_kv_transfer"],
                         m.value("vllm:prompt_tokens_cached_total"))
        for source, tier in (("device", "device"), ("host", "host"), ("disk", "disk"),
                             ("external_unspecified", "shared")):
            self.assertEqual(m.value("vllm:prompt_tokens_cached_by_source_total", source=source),
                             m.value("cairn_prefix_cache_hit_tokens_total", tier=tier))
        self.assertEqual(m.value("vllm:prompt_tokens_cached_by_source_total", source="p2p"), 0)
        self.assertEqual(m.value("vllm:request_success_total", finished_reason="error"), 0)


if __name__ == "__main__":
    harness.main()
