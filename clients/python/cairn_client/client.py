"""A client for `cairn serve` (the native msgpack-RPC protocol, docs/protocol.md).

One `Client` is one connection. It is safe to share between threads: every
call gets its own msgid, writes are serialised by a lock, and a background
reader thread hands each response (and each streamed delta) to the call that
is waiting for it, so requests from several threads run concurrently on the
server over the one socket.
"""
from __future__ import annotations

import itertools
import os
import queue
import socket
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

import msgpack

REQUEST, RESPONSE, NOTIFICATION = 0, 1, 2
DEFAULT_PORT = 7077


# --------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------
class CairnError(Exception):
    """An error response from the server: `code` (negative int), `type`
    (e.g. "invalid_request") and `message`, as docs/protocol.md lists them."""

    def __init__(self, code: int, type: str, message: str):
        super().__init__(f"{type} ({code}): {message}")
        self.code = code
        self.type = type
        self.message = message


class InvalidRequest(CairnError):
    pass


class TooLarge(CairnError):
    pass


class NotFound(CairnError):
    pass


class Overloaded(CairnError):
    pass


class Unsupported(CairnError):
    pass


class InternalError(CairnError):
    pass


class Unauthorized(CairnError):
    """The server wants a token (`auth`) first, or the token was wrong. The
    server closes the connection after this answer."""


_ERROR_CLASSES = {
    "invalid_request": InvalidRequest,
    "too_large": TooLarge,
    "not_found": NotFound,
    "overloaded": Overloaded,
    "unsupported": Unsupported,
    "internal": InternalError,
    "unauthorized": Unauthorized,
}


class CairnConnectionError(ConnectionError):
    """The connection closed (or failed) before the server answered."""


def _error_from_wire(err: Any) -> CairnError:
    # The contract says a map {code, type, message}; anything else is turned
    # into a readable error rather than a crash in the reader thread.
    if isinstance(err, dict):
        etype = str(err.get("type", "internal"))
        code = err.get("code", -11)
        message = str(err.get("message", ""))
    else:
        etype, code, message = "internal", -11, repr(err)
    cls = _ERROR_CLASSES.get(etype, CairnError)
    return cls(int(code) if isinstance(code, int) else -11, etype, message)


# --------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------
@dataclass
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    # Where the cached tokens were found: {"device", "host", "disk"} -> tokens
    # (sums to cached_tokens). Empty when the server does not report it.
    cached_tokens_by_tier: Dict[str, int] = field(default_factory=dict)
    # How the reply was decoded when it speculated: {"method", "steps",
    # "tokens", "tau", "drafted", "accepted"}; empty when it did not.
    speculative: Dict[str, Any] = field(default_factory=dict)
    # Why the rest of the prompt was not cached (docs/why-recomputed.md):
    # {"reason" (None on a hit), "position", "closest_tokens", "closest_tier",
    # "evicted_tier", "prompt_excerpt", "cached_excerpt" (token ids)}; None
    # when the server did not look (or does not report it).
    cache_miss: Optional[Dict[str, Any]] = None


@dataclass
class GenerationResult:
    """The final result of `generate` / `session_generate`. `raw` keeps the
    whole map, including fields this client does not know yet.

    With `tools` on session_generate, a reply that calls them has
    finish_reason "tool_calls", `tool_calls` (OpenAI's shape: {id, type,
    function: {name, arguments}} with arguments as JSON text) and `content`
    (the text around the calls); `text` is always the whole reply. A chat
    reply in channels (gpt-oss's harmony) also has `content` (its answer,
    without markers) and `reasoning` (its analysis, or None)."""

    text: str
    tokens: List[int]
    finish_reason: str
    usage: Usage
    tool_calls: List[Dict[str, Any]] = field(default_factory=list)
    content: Optional[str] = None
    reasoning: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_wire(cls, m: Dict[str, Any]) -> "GenerationResult":
        u = m.get("usage") or {}
        by_tier = u.get("cached_tokens_by_tier")
        by_tier = {str(k): int(v) for k, v in by_tier.items()} if isinstance(by_tier, dict) else {}
        return cls(
            text=m.get("text", ""),
            tokens=list(m.get("tokens") or []),
            finish_reason=m.get("finish_reason", ""),
            tool_calls=list(m.get("tool_calls") or []),
            content=m.get("content"),
            reasoning=m.get("reasoning"),
            usage=Usage(
                prompt_tokens=int(u.get("prompt_tokens", 0)),
                cached_tokens=int(u.get("cached_tokens", 0)),
                completion_tokens=int(u.get("completion_tokens", 0)),
                cached_tokens_by_tier=by_tier,
                speculative=dict(u.get("speculative") or {}),
                cache_miss=dict(u["cache_miss"]) if isinstance(u.get("cache_miss"), dict) else None,
            ),
            raw=m,
        )


@dataclass
class Delta:
    """A piece of streamed output: new text (complete UTF-8) and token ids."""

    text: str
    tokens: List[int]


# --------------------------------------------------------------------------
# pending calls and streams
# --------------------------------------------------------------------------
class PendingCall:
    """A request in flight. `result()` blocks until its response."""

    def __init__(self, client: "Client", msgid: int):
        self._client = client
        self.msgid = msgid
        self._done = threading.Event()
        self._result: Any = None
        self._error: Optional[BaseException] = None

    def _resolve(self, error: Optional[BaseException], result: Any) -> None:
        self._error, self._result = error, result
        self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: Optional[float] = None) -> Any:
        if not self._done.wait(timeout):
            raise TimeoutError(f"no response to request {self.msgid} within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result


class Stream:
    """A streaming generation. Iterating yields `Delta` objects as tokens are
    produced and, last, the `GenerationResult`. `cancel()` asks the server to
    stop it (the result then has finish_reason "cancelled"); `result` holds
    the final result once iteration has reached it."""

    _END = object()

    def __init__(self, client: "Client", msgid: int):
        self._client = client
        self.msgid = msgid
        self._items: "queue.Queue[Any]" = queue.Queue()
        self.result: Optional[GenerationResult] = None
        self._finished = False

    # called from the reader thread, in the order the server sent them
    def _delta(self, d: Delta) -> None:
        self._items.put(d)

    def _resolve(self, error: Optional[BaseException], result: Any) -> None:
        self._items.put((error, result))

    def cancel(self) -> bool:
        """Ask the server to cancel this generation. Returns the server's
        `cancelled` flag (False when it had already finished)."""
        return self._client.cancel(self.msgid)

    def __iter__(self) -> Iterator[Union[Delta, GenerationResult]]:
        return self

    def __next__(self) -> Union[Delta, GenerationResult]:
        if self._finished:
            raise StopIteration
        try:
            item = self._items.get(timeout=self._client.timeout)
        except queue.Empty:
            raise TimeoutError(f"no output from request {self.msgid} within "
                               f"{self._client.timeout} s") from None
        if isinstance(item, Delta):
            return item
        self._finished = True
        error, result = item
        if error is not None:
            raise error
        self.result = GenerationResult.from_wire(result)
        return self.result

    def deltas(self) -> Iterator[Delta]:
        """Only the deltas; the final result is left in `self.result`."""
        for item in self:
            if isinstance(item, Delta):
                yield item

    def wait(self) -> GenerationResult:
        """Consume the rest of the stream and return the final result."""
        for _ in self:
            pass
        assert self.result is not None
        return self.result


# --------------------------------------------------------------------------
# the client
# --------------------------------------------------------------------------
def _sampling(kw: Dict[str, Any]) -> Dict[str, Any]:
    # Only send what the caller set, so server defaults stay the server's.
    return {k: v for k, v in kw.items() if v is not None}


def _list(v):
    return None if v is None else [dict(x) for x in v]


def _content(messages, text, tokens) -> Dict[str, Any]:
    given = [n for n, v in (("messages", messages), ("text", text), ("tokens", tokens)) if v is not None]
    if len(given) > 1:
        raise ValueError("give at most one of messages, text, tokens (got %s)" % ", ".join(given))
    out: Dict[str, Any] = {}
    if messages is not None:
        out["messages"] = [dict(m) for m in messages]
    if text is not None:
        out["text"] = text
    if tokens is not None:
        out["tokens"] = [int(t) for t in tokens]
    return out


class Client:
    """A connection to `cairn serve`.

        Client()                              # 127.0.0.1:7077
        Client("10.0.0.2", 7077)
        Client(unix_path="/run/cairn.sock")
        Client.connect("unix:/run/cairn.sock") / Client.connect("host:port")
        Client("10.0.0.2", auth_token="...")   # a server with a token or tenants

    `timeout` bounds connecting and each blocking call (None = wait forever).
    `auth_token`: sent with `auth` as the first request, before the
    constructor returns (raises Unauthorized when it is wrong); `tenant` then
    holds the tenant name the server reported (None without tenants). Use as
    a context manager or call close().
    """

    def __init__(self, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *,
                 unix_path: Optional[str] = None, timeout: Optional[float] = None,
                 auth_token: Optional[str] = None):
        self.timeout = timeout
        self.tenant: Optional[str] = None
        if unix_path is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect(unix_path)
        else:
            sock = socket.create_connection((host, port), timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(None)  # the reader thread blocks; calls time out on their own
        self._sock = sock
        self._send_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._pending: Dict[int, Union[PendingCall, Stream]] = {}
        self._ids = itertools.count(1)
        self._closed_error: Optional[BaseException] = None
        self._packer = msgpack.Packer(use_bin_type=True)
        self._reader = threading.Thread(target=self._read_loop, name="cairn-client-reader",
                                        daemon=True)
        self._reader.start()
        if auth_token is not None:
            try:
                self.auth(auth_token)
            except BaseException:
                self.close()
                raise

    @classmethod
    def connect(cls, address: str, timeout: Optional[float] = None, *,
                auth_token: Optional[str] = None) -> "Client":
        """`unix:/path`, a path containing '/', `host:port`, or `host`."""
        if address.startswith("unix:"):
            return cls(unix_path=address[5:], timeout=timeout, auth_token=auth_token)
        if "/" in address:
            return cls(unix_path=address, timeout=timeout, auth_token=auth_token)
        host, _, port = address.rpartition(":")
        if not host:
            return cls(address, DEFAULT_PORT, timeout=timeout, auth_token=auth_token)
        return cls(host.strip("[]"), int(port), timeout=timeout, auth_token=auth_token)

    # -- plumbing ---------------------------------------------------------
    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection. Calls still waiting fail with
        CairnConnectionError; the server cancels their generations."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        self._reader.join(timeout=5)

    def _next_msgid(self) -> int:
        # msgids are < 2^32 on the wire; skip any still in flight after a wrap.
        with self._state_lock:
            while True:
                msgid = next(self._ids) & 0xFFFFFFFF
                if msgid not in self._pending:
                    return msgid

    def _send(self, method: str, params: Dict[str, Any], waiter_cls) -> Union[PendingCall, Stream]:
        msgid = self._next_msgid()
        waiter = waiter_cls(self, msgid)
        with self._state_lock:
            if self._closed_error is not None:
                raise CairnConnectionError(str(self._closed_error))
            self._pending[msgid] = waiter
        data = self._packer.pack([REQUEST, msgid, method, [params]])
        try:
            with self._send_lock:
                self._sock.sendall(data)
        except OSError as e:
            with self._state_lock:
                self._pending.pop(msgid, None)
            raise CairnConnectionError(f"send failed: {e}") from e
        return waiter

    def _read_loop(self) -> None:
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        reason: BaseException = CairnConnectionError("connection closed by the server")
        try:
            while True:
                chunk = self._sock.recv(1 << 16)
                if not chunk:
                    break
                unpacker.feed(chunk)
                for msg in unpacker:
                    self._dispatch(msg)
        except OSError as e:
            reason = CairnConnectionError(f"connection lost: {e}")
        except Exception as e:  # an undecodable stream: nothing after it can be trusted
            reason = CairnConnectionError(f"bad data from server: {e!r}")
        with self._state_lock:
            self._closed_error = reason
            waiting, self._pending = list(self._pending.values()), {}
        for w in waiting:
            w._resolve(reason, None)

    def _dispatch(self, msg: Any) -> None:
        if not isinstance(msg, (list, tuple)) or not msg:
            return
        if msg[0] == RESPONSE and len(msg) == 4:
            _, msgid, error, result = msg
            with self._state_lock:
                w = self._pending.pop(msgid, None)
            if w is not None:
                w._resolve(_error_from_wire(error) if error is not None else None, result)
        elif msg[0] == NOTIFICATION and len(msg) == 3:
            _, method, params = msg
            if method != "gen.delta" or not params or not isinstance(params[0], dict):
                return  # unknown notifications are ignored, as the contract asks
            p = params[0]
            with self._state_lock:
                w = self._pending.get(p.get("request"))
            if isinstance(w, Stream):
                w._delta(Delta(p.get("text", ""), list(p.get("tokens") or [])))

    # -- generic calls ----------------------------------------------------
    def call_async(self, method: str, params: Optional[Dict[str, Any]] = None) -> PendingCall:
        """Send a request without waiting; `.result()` on the returned object
        waits for (and returns, or raises) the response."""
        return self._send(method, params or {}, PendingCall)  # type: ignore[return-value]

    def call(self, method: str, params: Optional[Dict[str, Any]] = None) -> Any:
        """Send a request and return its result map (raises CairnError)."""
        return self.call_async(method, params).result(self.timeout)

    def stream(self, method: str, params: Dict[str, Any]) -> Stream:
        params = dict(params, stream=True)
        return self._send(method, params, Stream)  # type: ignore[return-value]

    # -- methods ----------------------------------------------------------
    def auth(self, token: str) -> Optional[str]:
        """auth: present a token. Returns (and keeps in `tenant`) the tenant
        name, or None on a server without tenants (which accepts any token).
        A wrong token raises Unauthorized and the server closes the
        connection."""
        self.tenant = self.call("auth", {"token": token}).get("tenant")
        return self.tenant

    def info(self) -> Dict[str, Any]:
        """server.info: version, model {name, arch, n_ctx, n_vocab}, page_size, limits."""
        return self.call("server.info")

    def generate(self, prompt: Optional[str] = None, *, tokens: Optional[Sequence[int]] = None,
                 messages: Optional[Sequence[Dict[str, Any]]] = None,
                 tools: Optional[Sequence[Dict[str, Any]]] = None,
                 tool_choice: Optional[Union[str, Dict[str, Any]]] = None,
                 parallel_tool_calls: Optional[bool] = None,
                 add_bos: Optional[bool] = None, parse_special: Optional[bool] = None,
                 stream: bool = False, **sampling) -> Union[GenerationResult, Stream]:
        """Stateless generation from a text `prompt`, a list of `tokens`, or
        a conversation (`messages`, rendered with the model's chat template
        and the assistant cue; `tools` are rendered with it and the reply is
        read for their calls, see session_generate).
        Sampling keywords: max_tokens, temperature, top_k, top_p, min_p,
        repeat_penalty, frequency_penalty, presence_penalty, seed, stop,
        logit_bias ({token id: bias in [-100, 100]}), response_format.
        With stream=True returns a Stream (deltas, then the result)."""
        if sum(x is not None for x in (prompt, tokens, messages)) != 1:
            raise ValueError("give exactly one of prompt, tokens, messages")
        params = _sampling(dict(sampling, add_bos=add_bos, parse_special=parse_special,
                                tools=_list(tools), tool_choice=tool_choice,
                                parallel_tool_calls=parallel_tool_calls))
        if prompt is not None:
            params["prompt"] = prompt
        elif messages is not None:
            params["messages"] = [dict(m) for m in messages]
        else:
            params["tokens"] = [int(t) for t in tokens]  # type: ignore[union-attr]
        return self._generation("generate", params, stream)

    def _generation(self, method: str, params: Dict[str, Any], stream: bool):
        if stream:
            return self.stream(method, params)
        return GenerationResult.from_wire(self.call(method, params))

    def session_open(self, *, system: Optional[str] = None,
                     messages: Optional[Sequence[Dict[str, Any]]] = None,
                     text: Optional[str] = None, tokens: Optional[Sequence[int]] = None,
                     tools: Optional[Sequence[Dict[str, Any]]] = None,
                     persist: Optional[bool] = None, ttl_s: Optional[float] = None) -> Dict[str, Any]:
        """Open a session; returns {session_id, n_tokens}. persist=True makes
        the session durable (its record and pages are on disk before any call
        that changed it returns; needs a server with --cache-dir). `tools`
        (OpenAI function tools) are rendered with the messages, as the
        model's chat template presents them; pass them again to
        session_generate to have replies read for calls."""
        params = _content(messages, text, tokens)
        params.update(_sampling(dict(system=system, persist=persist, ttl_s=ttl_s,
                                     tools=_list(tools))))
        return self.call("session.open", params)

    def session_append(self, session_id: str, *, messages=None, text: Optional[str] = None,
                       tokens: Optional[Sequence[int]] = None) -> Dict[str, Any]:
        """Append to a session's history; returns {n_tokens}."""
        params = dict(_content(messages, text, tokens), session_id=session_id)
        return self.call("session.append", params)

    def session_generate(self, session_id: str, *, messages=None, text: Optional[str] = None,
                         tokens: Optional[Sequence[int]] = None, stream: bool = False,
                         tools: Optional[Sequence[Dict[str, Any]]] = None,
                         tool_choice: Optional[Union[str, Dict[str, Any]]] = None,
                         parallel_tool_calls: Optional[bool] = None,
                         **sampling) -> Union[GenerationResult, Stream]:
        """Append (optionally) and generate; the output joins the history.
        With `tools`, the reply is read for calls of them (result.tool_calls);
        tool_choice "required" or {"type": "function", "function": {"name":
        N}} forces a call ("none" reads nothing)."""
        params = dict(_content(messages, text, tokens), session_id=session_id)
        params.update(_sampling(dict(sampling, tools=_list(tools), tool_choice=tool_choice,
                                     parallel_tool_calls=parallel_tool_calls)))
        return self._generation("session.generate", params, stream)

    def session_fork(self, session_id: str) -> str:
        """A new session with the same history; returns its id."""
        return self.call("session.fork", {"session_id": session_id})["session_id"]

    def session_truncate(self, session_id: str, n_tokens: int) -> int:
        """Keep the first n_tokens of the history; returns the new length."""
        return self.call("session.truncate", {"session_id": session_id,
                                              "n_tokens": n_tokens})["n_tokens"]

    def session_close(self, session_id: str) -> bool:
        return bool(self.call("session.close", {"session_id": session_id}).get("closed"))

    def session_info(self, session_id: str) -> Dict[str, Any]:
        return self.call("session.info", {"session_id": session_id})

    def cancel(self, request: int) -> bool:
        """gen.cancel: cancel a request of this connection by its msgid."""
        return bool(self.call("gen.cancel", {"request": request}).get("cancelled"))

    def tokenize(self, text: str, *, add_bos: Optional[bool] = None,
                 parse_special: Optional[bool] = None) -> List[int]:
        params = _sampling(dict(text=text, add_bos=add_bos, parse_special=parse_special))
        return list(self.call("tokenize", params)["tokens"])

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.call("detokenize", {"tokens": [int(t) for t in tokens]})["text"]

    def cache_stats(self) -> Dict[str, Any]:
        return self.call("cache.stats")


def connect_from_env(default: str = "127.0.0.1:7077", timeout: Optional[float] = None) -> Client:
    """Connect to $CAIRN_ADDR (`host:port` or `unix:/path`), else `default`,
    authenticating with $CAIRN_AUTH_TOKEN when it is set."""
    return Client.connect(os.environ.get("CAIRN_ADDR", default), timeout=timeout,
                          auth_token=os.environ.get("CAIRN_AUTH_TOKEN") or None)
