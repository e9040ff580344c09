#!/usr/bin/env python3
"""cairn behind the routers people deploy (issue 42): three replicas of the
real instruct model (CAIRN_CHAT_MODEL) behind vllm-router 0.1.17
(round_robin, cache_aware, and kv_aware fed by cairn's --kv-events),
sglang-router 0.3.2 (cache_aware) and `cairn route`, all real processes.

  - RAG, 3 documents x 4 questions interleaved, one at a time: the prompt
    tokens the replicas computed (their /metrics) are at most 1.1x the
    floor (every prompt's tokens past its longest prefix shared with an
    earlier one) through kv_aware and through cairn route; every router's
    figure is printed.
  - A burst of 8 requests at once over one cold document through kv_aware,
    replicas with --shared-write all: the router spreads the burst, the
    replicas wait for the one computing the document (session/prefix.c,
    "remote"): at most 1.2x the floor.
  - Same request, same tokens: one greedy request answers the same text
    directly and through every router.
  - Failures, behind kv_aware: a replica SIGKILLed while requests run and
    restarted on its port and --cache-dir: no request that was not running
    on it fails, and after the restart the document only it had computed is
    sent to it again (its LMDB pages announced at start) and found there;
    the router itself killed and restarted: the replicas send it their
    whole state when it subscribes, and each document goes to the replica
    that holds it.
Skips (77) when the model, redis-server, pyzmq/msgspec or the router wheels
(installed with pip when missing) cannot be had.

usage: test_routers.py CAIRN_BIN [unittest args...]
"""
import os
import shutil
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
import harness  # noqa: E402
import routers  # noqa: E402
import vllm_kv_events as kv  # noqa: E402

[CAIRN] = harness.take_argv("CAIRN_BIN", usage=__doc__)
MODEL = os.environ.get("CAIRN_CHAT_MODEL", "")
why = None
if not os.path.exists(MODEL):
    why = f"CAIRN_CHAT_MODEL ({MODEL or 'unset'}) is absent; scripts/get-model fetches it"
elif kv.zmq is None or kv.msgspec is None:
    why = "pyzmq and msgspec are needed (scripts/setup.sh --test installs them)"
elif not shutil.which("redis-server"):
    why = "redis-server is needed (scripts/setup.sh --test installs it)"
else:
    why = routers.have_routers()
if why:
    print("skipped: " + why)
    sys.exit(77)
from redis_server import RedisServer  # noqa: E402  (needs redis-py)

N = 3
DOC_WORDS = 220


class Replicas:
    """N replicas on fixed ports (a restarted one comes back where the
    router expects it), each with a cache directory, KV events and a replay
    socket, and the shared tier's page events for cairn route."""

    def __init__(self, scratch, redis_url, tag, shared_write="none"):
        self.scratch, self.redis_url, self.tag = scratch, redis_url, tag
        self.args, self.servers, self.events = [], [], {}
        for i in range(N):
            http, pub, rep = routers.free_port(), routers.free_port(), routers.free_port()
            args = ["-m", MODEL, "-t", "1", "-c", "2048", "--http-port", str(http),
                    "--cache-dir", os.path.join(scratch.name, f"{tag}-r{i}"),
                    "--kv-events", f"tcp://127.0.0.1:{pub}",
                    "--kv-events-replay", f"tcp://127.0.0.1:{rep}",
                    "--shared-cache", redis_url, "--shared-write", shared_write,
                    "--shared-timeout", "2000",  # a loaded test machine is not a Redis outage
                    "--replica-id", f"{tag}-r{i}"]
            if shared_write == "all":
                # a prefill slowed down by a loaded test machine is not a dead
                # replica: the waiters' patience (5 s without a new page by
                # default) outlasts it, so the burst test measures the wait
                args += ["--shared-wait", "60"]
            self.args.append(args)
            self.events[f"http://127.0.0.1:{http}"] = (f"tcp://127.0.0.1:{pub}",
                                                      f"tcp://127.0.0.1:{rep}")
            self.servers.append(None)
            self.start(i)

    def start(self, i):
        self.servers[i] = self.scratch.start(CAIRN, self.args[i])
        return self.servers[i]

    @property
    def urls(self):
        return list(self.events)

    @property
    def ports(self):
        return [s.http_port for s in self.servers]

    def computed(self):
        return routers.computed_tokens(self.ports)


class RoutersTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.scratch = harness.Scratch(prefix="cairn-routers-")
        cls.redis = RedisServer(cls.scratch.name)
        cls.scratch.on_close(cls.redis.stop)
        cls.tok = routers.tokenizer_folder(MODEL, os.path.join(cls.scratch.name, "tokenizer"))
        cls.figures = {}

    def setUp(self):
        # every test starts from an empty Redis: pages one test's replicas
        # wrote there (--shared-write all) would be served to the next
        # test's, below its floor
        self.redis.db.flushall()

    @classmethod
    def tearDownClass(cls):
        for k, v in sorted(cls.figures.items()):
            print(f"{k}: {v}")
        cls.scratch.close()

    def router(self, kind, reps, log):
        path = os.path.join(self.scratch.name, log)
        if kind == "cairn route":
            r = routers.CairnRoute(CAIRN, MODEL, reps.servers, self.redis.url, path,
                                   ids=[f"{reps.tag}-r{i}" for i in range(N)])
        elif kind == "sglang-router":
            r = routers.SglangRouter(reps.urls, path)
        else:
            r = routers.VllmRouter(kind, reps.urls, path, events=reps.events, tokenizer=self.tok)
        self.scratch.on_close(r.kill)
        return r

    def rag(self, kind):
        reps = Replicas(self.scratch, self.redis.url, kind.replace(" ", "-"))
        r = self.router(kind, reps, f"{kind}-rag.log")
        reqs = routers.rag_requests(harness.WORDS, 3, 4, DOC_WORDS)
        for _, body in reqs:
            routers.post_json(r.port, "/v1/chat/completions", body)
            time.sleep(0.3)  # interleaved, one at a time; the events reach the router
        floor = routers.floor_tokens(reps.ports[0], reqs)
        computed = reps.computed()
        self.figures[f"rag {kind}"] = f"computed {computed}, floor {floor}, {computed / floor:.2f}x"
        r.kill()
        for s in reps.servers:
            s.kill()
        return computed, floor

    def test_rag_kv_aware(self):
        computed, floor = self.rag("kv_aware")
        self.assertLessEqual(computed, 1.1 * floor)

    def test_rag_cairn_route(self):
        computed, floor = self.rag("cairn route")
        self.assertLessEqual(computed, 1.1 * floor)

    def test_rag_other_routers_for_the_record(self):
        for kind in ("round_robin", "cache_aware", "sglang-router"):
            computed, floor = self.rag(kind)
            self.assertGreaterEqual(computed, floor)  # nobody beats the floor

    def test_burst_over_a_cold_document(self):
        # --shared-write all: a replica that finds another computing the
        # document waits for its pages (session/prefix.c, "remote")
        reps = Replicas(self.scratch, self.redis.url, "burst", shared_write="all")
        r = self.router("kv_aware", reps, "burst.log")
        reqs = routers.rag_requests(harness.WORDS, 1, 8, DOC_WORDS, offset=500)
        replies, failures = routers.run_concurrent(r.port, [b for _, b in reqs])
        self.assertEqual(failures, [])
        floor = routers.floor_tokens(reps.ports[0], reqs)
        computed = reps.computed()
        self.figures["burst kv_aware"] = f"computed {computed}, floor {floor}, {computed / floor:.2f}x"
        # vllm-router 0.1.17 sends a burst over a prefix nobody has
        # announced yet by least load, to every replica; the replicas then
        # compute the document once between them, as long as Redis answered
        # (an outage costs cache hits, never requests: then each replica
        # computes it once at most)
        outages = sum(routers.metrics(p)["cairn_shared_outages_total"] for p in reps.ports)
        waits = [(routers.metrics(p)["cairn_prefix_remote_waits_total"],
                  routers.metrics(p)["cairn_prefix_remote_wait_timeouts_total"])
                 for p in reps.ports]
        self.figures["burst kv_aware"] += f"; remote waits/timeouts per replica {waits}"
        self.assertLessEqual(computed, (1.2 if outages == 0 else N) * floor,
                             f"computed {computed}, floor {floor}, outages {outages}, "
                             f"remote waits/timeouts {waits}")

    def test_same_tokens_through_every_router(self):
        reps = Replicas(self.scratch, self.redis.url, "same")
        body = {"messages": [{"role": "user", "content": "Write a haiku about caches."}],
                "max_tokens": 16, "temperature": 0}
        want = routers.post_json(reps.ports[0], "/v1/chat/completions", body)
        want = want["choices"][0]["message"]["content"]
        for kind in ("round_robin", "cache_aware", "kv_aware", "sglang-router", "cairn route"):
            r = self.router(kind, reps, f"same-{kind}.log")
            for _ in range(2):
                got = routers.post_json(r.port, "/v1/chat/completions", body)
                self.assertEqual(got["choices"][0]["message"]["content"], want, kind)
            r.kill()

    def holder(self, reps, before):
        """The replica whose computed tokens grew since `before`."""
        after = [routers.computed_tokens([p]) for p in reps.ports]
        grew = [i for i in range(N) if after[i] > before[i]]
        return grew, after

    def test_failures_replica_and_router_restarted(self):
        reps = Replicas(self.scratch, self.redis.url, "fail")
        r = self.router("kv_aware", reps, "fail.log")
        reqs = routers.rag_requests(harness.WORDS, 3, 2, DOC_WORDS, offset=300)
        for _, body in reqs[:3]:  # each document once
            routers.post_json(r.port, "/v1/chat/completions", body)
            time.sleep(0.3)
        # who holds document 0: ask it again and see who did not compute it
        before = [routers.computed_tokens([p]) for p in reps.ports]
        routers.post_json(r.port, "/v1/chat/completions", reqs[3][1])
        after = [routers.computed_tokens([p]) for p in reps.ports]
        cached = [i for i in range(N) if 0 < after[i] - before[i] < 40]
        self.assertEqual(len(cached), 1, f"document {reqs[3][0]} not found: {before} -> {after}")
        victim = cached[0]
        doc_of_victim = reqs[3][0]

        # SIGKILL the replica holding it while a burst runs on the others
        others = [b for d, b in reqs[:3] if d != doc_of_victim]
        reps.servers[victim].kill()
        replies, failures = routers.run_concurrent(r.port, others * 2)
        self.assertEqual(failures, [], "requests failed that were not running on the victim")
        # restarted on its port and directory: its LMDB pages are announced
        reps.start(victim)
        time.sleep(1.5)  # the router's health check (1 s) sees it again
        before = [routers.computed_tokens([p]) for p in reps.ports]
        routers.post_json(r.port, "/v1/chat/completions", reqs[3][1])
        after = [routers.computed_tokens([p]) for p in reps.ports]
        self.assertGreater(after[victim], before[victim], "not sent to the restarted replica")
        self.assertLess(after[victim] - before[victim], 40, "the restarted replica recomputed it")

        # the router restarted: its subscriptions make every replica send
        # its whole state again, so documents go where they are
        r.kill()
        r = self.router("kv_aware", reps, "fail-restarted.log")
        time.sleep(1.0)
        for d, body in reqs[:3]:
            before = [routers.computed_tokens([p]) for p in reps.ports]
            routers.post_json(r.port, "/v1/chat/completions", dict(body, max_tokens=3))
            after = [routers.computed_tokens([p]) for p in reps.ports]
            spent = sum(after) - sum(before)
            self.assertLess(spent, 40, f"document {d} recomputed after the router's restart")


if __name__ == "__main__":
    harness.main()
