"""A prefix being computed on one replica is not computed again on another.

Replicas of the real instruct model (prompts take about a second to compute
here, so requests really overlap), each with a cache directory of its own,
over one real redis-server, started with `--shared-write all`: every page a
replica computes goes to Redis as it is computed, and its lookup marks say
so. What is checked (session/prefix.c, "remote"):

  - a burst of requests over one cold document, sent at once to three
    replicas: the prompt tokens the replicas computed, from their /metrics,
    are at most 1.2x the floor (the document once, each question once;
    when a replica lost Redis during the burst, which costs cache hits,
    each computes it once at most), the
    replicas that waited say so (cairn_prefix_remote_waits_total), and every
    answer is the one a fresh server alone gives (same tokens);
  - the same burst with `--shared-wait 0` (never wait) computes the
    document on every replica: the figure the wait removes;
  - a replica that stops while computing (SIGSTOP after its lookup): the
    other replica waits --shared-wait seconds without a new page, gives up
    (cairn_prefix_remote_wait_timeouts_total), computes the prompt itself
    and answers it right; the stopped one, resumed, answers too.

Skips (77) without the model or redis-server.

Usage: test_shared_wait.py CAIRN_BIN
"""
import os
import shutil
import signal
import sys
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
import harness  # noqa: E402
import routers  # noqa: E402

[CAIRN] = harness.take_argv("CAIRN_BIN", usage=__doc__)
MODEL = os.environ.get("CAIRN_CHAT_MODEL", "")
if not os.path.exists(MODEL):
    print(f"skipped: CAIRN_CHAT_MODEL ({MODEL or 'unset'}) is absent; scripts/get-model fetches it")
    sys.exit(77)
if not shutil.which("redis-server"):
    print("skipped: redis-server is needed (scripts/setup.sh --test installs it)")
    sys.exit(77)
from redis_server import RedisServer  # noqa: E402  (needs redis-py)

DOC_WORDS = 220


class SharedWait(unittest.TestCase):
    def setUp(self):
        self.scratch = harness.Scratch(prefix="cairn-shared-wait-")
        self.addCleanup(self.scratch.close)
        self.redis = RedisServer(self.scratch.name)
        self.scratch.on_close(self.redis.stop)

    def replicas(self, n, tag, *extra):
        out = []
        for i in range(n):
            out.append(self.scratch.start(CAIRN, [
                "-m", MODEL, "-t", "1", "-c", "2048", "--http-port", str(harness.free_port()),
                "--cache-dir", os.path.join(self.scratch.name, f"{tag}-{i}"),
                "--shared-cache", self.redis.url, "--shared-write", "all",
                "--shared-timeout", "2000",  # a loaded test machine is not a Redis outage
                *extra]))
        return out

    def burst(self, servers, bodies):
        """Body k to servers[k % n], all at once: the answers' texts."""
        replies, failures = routers.run_concurrent([s.http_port for s in servers], bodies)
        self.assertEqual(failures, [])
        return [r["choices"][0]["message"]["content"] for r in replies]

    def reference(self, bodies):
        """What one fresh server alone answers, one request at a time."""
        [alone] = self.replicas(1, "alone-" + str(time.monotonic_ns()), "--shared-wait", "0")
        try:
            return [routers.post_json(alone.http_port, "/v1/chat/completions", b)
                    ["choices"][0]["message"]["content"] for b in bodies]
        finally:
            alone.kill()

    def test_a_burst_over_a_cold_document_computes_it_once(self):
        reqs = [b for _, b in routers.rag_requests(harness.WORDS, 1, 6, DOC_WORDS, offset=700)]
        servers = self.replicas(3, "burst")
        got = self.burst(servers, reqs)
        ports = [s.http_port for s in servers]
        floor = routers.floor_tokens(ports[0], [(0, b) for b in reqs])
        computed = routers.computed_tokens(ports)
        ms = [routers.metrics(p) for p in ports]
        waits = sum(m["cairn_prefix_remote_waits_total"] for m in ms)
        print(f"burst of {len(reqs)} over 3 replicas: computed {computed}, floor {floor} "
              f"({computed / floor:.2f}x), {waits:.0f} remote waits; per replica: " + ", ".join(
                  f"computed {m['cairn_prefix_cache_queries_total'] - m['cairn_prefix_cache_hits_total']:.0f}"
                  f" waits {m['cairn_prefix_remote_waits_total']:.0f}"
                  f" gave up {m['cairn_prefix_remote_wait_timeouts_total']:.0f}"
                  f" shared hits {m['cairn_shared_read_hits_total']:.0f}" for m in ms),
              file=sys.stderr)
        # while Redis answers; an outage costs cache hits, never requests
        outages = sum(m["cairn_shared_outages_total"] for m in ms)
        self.assertLessEqual(computed, (1.2 if outages == 0 else len(servers)) * floor)
        self.assertGreater(waits, 0)
        self.assertEqual(got, self.reference(reqs))

    def test_without_the_wait_every_replica_computes_the_document(self):
        reqs = [b for _, b in routers.rag_requests(harness.WORDS, 1, 6, DOC_WORDS, offset=900)]
        servers = self.replicas(3, "nowait", "--shared-wait", "0")
        self.burst(servers, reqs)
        ports = [s.http_port for s in servers]
        floor = routers.floor_tokens(ports[0], [(0, b) for b in reqs])
        computed = routers.computed_tokens(ports)
        print(f"the same without waiting: computed {computed}, floor {floor} "
              f"({computed / floor:.2f}x)", file=sys.stderr)
        self.assertEqual(sum(routers.metrics(p)["cairn_prefix_remote_waits_total"]
                             for p in ports), 0)
        self.assertGreater(computed, 1.5 * floor)

    def test_a_replica_that_stops_while_computing_is_waited_for_a_bounded_time(self):
        [a, b] = self.replicas(2, "stop", "--shared-wait", "1")
        reqs = [body for _, body in routers.rag_requests(harness.WORDS, 1, 2, 600, offset=300)]
        answers, errors = [None, None], []

        def ask(i, srv):
            try:
                answers[i] = routers.post_json(srv.http_port, "/v1/chat/completions",
                                               reqs[i])["choices"][0]["message"]["content"]
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))
        ta = threading.Thread(target=ask, args=(0, a))
        ta.start()
        # A has looked its prompt up (its marks are in Redis) before it stops
        harness.poll(lambda: self.redis.db.keys("cairn:s:*"), lambda k: len(k) > 0)
        os.kill(a.proc.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            ask(1, b)
            waited = time.monotonic() - t0
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        ta.join()
        self.assertEqual(errors, [])
        m = routers.metrics(b.http_port)
        self.assertEqual(m["cairn_prefix_remote_waits_total"], 1)
        self.assertEqual(m["cairn_prefix_remote_wait_timeouts_total"], 1)
        self.assertGreaterEqual(waited, 1.0)
        self.assertEqual(answers, self.reference(reqs))


if __name__ == "__main__":
    harness.main()
