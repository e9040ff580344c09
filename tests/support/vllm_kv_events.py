"""vLLM's KV-event classes and a subscriber that keeps a router's view of one
replica: what the tests (tests/kvevents, tests/route) and bench/scale decode
cairn's `--kv-events` stream with.

The classes are declared here from the schema vLLM 0.32 publishes
(vllm/distributed/kv_events.py: msgspec Structs, EventBatch array_like,
the events tag=True maps; field names, order, types and defaults as
there), so decoding is as strict as a vLLM consumer's: a wrong field name or
type fails. vLLM itself is not needed.

ReplicaView subscribes to the PUB socket and, if given, asks the replay
socket for everything from sequence 0, so nothing published before it
connected is missed; it applies batches strictly in sequence order.
"""
import threading
import time
from typing import Any

try:
    import msgspec
    import zmq
except ImportError:  # the callers skip, saying why
    msgspec = zmq = None

if msgspec is not None:
    class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
        ts: float
        events: list[Any]
        data_parallel_rank: int | None = None

    class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
        """A KV-cache event: tagged by class name under "type"."""

    class BlockStored(KVCacheEvent):
        block_hashes: list[bytes | int]
        parent_block_hash: bytes | int | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None
        lora_name: str | None
        extra_keys: list[tuple[Any, ...] | None] | None = None
        group_idx: int | None = None
        kv_cache_spec_kind: str | None = None
        kv_cache_spec_sliding_window: int | None = None
        locality: str | None = None
        ownership: str | None = None
        session_id: str | None = None

    class BlockRemoved(KVCacheEvent):
        block_hashes: list[bytes | int]
        medium: str | None
        group_idx: int | None = None
        locality: str | None = None
        ownership: str | None = None

    class AllBlocksCleared(KVCacheEvent):
        pass

    class KVEventBatch(EventBatch):
        events: list[BlockStored | BlockRemoved | AllBlocksCleared]

MEDIA = ("GPU", "CPU", "STORAGE")
END_SEQ = (-1).to_bytes(8, "big", signed=True)


class ReplicaView:
    """What a router knows of one replica from its events alone.

    .held[medium] is the set of block hashes announced there and not
    removed; .problems lists what a consumer could not have used (a stored
    run whose parent it never saw, a removal of a hash it did not hold);
    .cleared counts AllBlocksCleared; .applied the batches applied."""

    def __init__(self, endpoint, replay=None, topic=b""):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.sub.connect(endpoint)
        self.replay_endpoint = replay
        self.decoder = msgspec.msgpack.Decoder(KVEventBatch)
        self.lock = threading.Lock()
        self.pending = {}           # seq -> batch, not applied yet
        self.next_seq = None        # the next sequence number to apply
        self.held = {m: set() for m in MEDIA}
        self.ever = set()           # every hash ever stored (a parent may have moved on)
        self.problems = []
        self.cleared = 0
        self.applied = 0
        self.stored_runs = 0
        self.removed = {m: 0 for m in MEDIA}
        self.stored = {m: 0 for m in MEDIA}
        self.block_sizes = set()
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        if replay:
            self.catch_up()

    def catch_up(self, start=0):
        """Ask the replay socket for every kept batch from `start`."""
        d = self.ctx.socket(zmq.DEALER)
        d.connect(self.replay_endpoint)
        try:
            d.send_multipart([b"", start.to_bytes(8, "big")])
            while d.poll(10000):
                frames = d.recv_multipart()
                _, _topic, seq, payload = frames[:4]
                if seq == END_SEQ:
                    break
                self._take(int.from_bytes(seq, "big"), payload)
        finally:
            d.close(linger=0)
        with self.lock:
            if self.next_seq is None:
                self.next_seq = start
            self._apply_ready()

    def _run(self):
        while not self.stop:
            if not self.sub.poll(100):
                continue
            _topic, seq, payload = self.sub.recv_multipart()
            self._take(int.from_bytes(seq, "big"), payload)
            with self.lock:
                if self.next_seq is None and not self.replay_endpoint:
                    self.next_seq = min(self.pending)  # no replay: from what arrives
                self._apply_ready()

    def _take(self, seq, payload):
        batch = self.decoder.decode(payload)  # strict: vLLM's classes
        with self.lock:
            if self.next_seq is None or seq >= self.next_seq:
                self.pending[seq] = batch

    def _apply_ready(self):
        while self.next_seq is not None and self.next_seq in self.pending:
            self._apply(self.pending.pop(self.next_seq))
            self.next_seq += 1
            self.applied += 1

    def _apply(self, batch):
        for e in batch.events:
            if isinstance(e, AllBlocksCleared):
                self.held = {m: set() for m in MEDIA}
                self.cleared += 1
            elif isinstance(e, BlockStored):
                self.stored_runs += 1
                self.block_sizes.add(e.block_size)
                if e.medium not in MEDIA:
                    self.problems.append(f"medium {e.medium!r}")
                if len(e.token_ids) != len(e.block_hashes) * e.block_size:
                    self.problems.append("token_ids do not fill the blocks")
                if e.parent_block_hash is not None and e.parent_block_hash not in self.ever:
                    self.problems.append("a stored run under a parent never announced")
                for h in e.block_hashes:
                    self.held[e.medium].add(h)
                    self.ever.add(h)
                self.stored[e.medium] += len(e.block_hashes)
            else:
                for h in e.block_hashes:
                    if h not in self.held.get(e.medium, ()):
                        # LMDB reports every value it deletes, announced or
                        # not (a tenant's); memory tiers only what they told
                        if e.medium != "STORAGE":
                            self.problems.append(f"removed from {e.medium} what it never held")
                    self.held.get(e.medium, set()).discard(h)
                self.removed[e.medium] += len(e.block_hashes)

    def counts(self):
        with self.lock:
            return {m: len(s) for m, s in self.held.items()}

    def snapshot(self):
        with self.lock:
            return {m: set(s) for m, s in self.held.items()}

    def close(self):
        self.stop = True
        self.thread.join(5)
        self.sub.close(linger=0)
        self.ctx.term()

