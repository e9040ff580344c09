#!/usr/bin/env python3
"""A multi-turn agent session, with a fork to try two alternatives.

1. open a session with a system prompt and a task;
2. a few turns: the model answers, a (pretend) tool result is appended;
3. fork the session and continue each branch with a different instruction;
   both branches share the history's KV pages, so neither recomputes it;
4. keep the branch we like, close the other.

    python3 clients/python/examples/agent.py --spawn build/cairn
"""
from _connect import Connection, parser

SYSTEM = "You are a helpful agent. You tell short stories and use tools when asked."


def show(label, r):
    print(f"[{label}] prompt {r.usage.prompt_tokens} tokens, {r.usage.cached_tokens} cached; "
          f"{r.finish_reason}: {r.text.strip()[:70]!r}")


def main():
    ap = parser(__doc__.split("\n\n")[0])
    ap.add_argument("--max-tokens", type=int, default=24)
    args = ap.parse_args()
    gen = dict(max_tokens=args.max_tokens, temperature=0)

    with Connection(args) as c:
        s = c.session_open(system=SYSTEM,
                           messages=[{"role": "user", "content": "Tell me about a dog."}])
        sid = s["session_id"]
        print(f"session {sid}: {s['n_tokens']} tokens of history")

        show("turn 1", c.session_generate(sid, **gen))
        c.session_append(sid, messages=[{"role": "tool",
                                         "content": "weather: sunny, the park is open"}])
        show("turn 2", c.session_generate(sid, messages=[{"role": "user",
                                                          "content": "Where does it go today?"}],
                                          **gen))

        # Try two alternatives from the same point.
        branch = c.session_fork(sid)
        print(f"\nforked {sid[:8]}.. -> {branch[:8]}.. at "
              f"{c.session_info(branch)['n_tokens']} tokens")
        a = c.session_generate(sid, messages=[{"role": "user", "content": "Make it funny."}],
                               **gen)
        b = c.session_generate(branch, messages=[{"role": "user", "content": "Make it sad."}],
                               **gen)
        show("A funny", a)
        show("B sad  ", b)

        # Streaming works the same way: deltas, then the final result.
        print("\n[A, streamed] ", end="", flush=True)
        stream = c.session_generate(sid, messages=[{"role": "user", "content": "The end?"}],
                                    stream=True, **gen)
        for delta in stream.deltas():
            print(delta.text, end="", flush=True)
        print(f"\n  ({stream.result.usage.completion_tokens} tokens, "
              f"{stream.result.finish_reason})")

        keep = sid if len(a.text) >= len(b.text) else branch
        drop = branch if keep == sid else sid
        c.session_close(drop)
        print(f"\nkept {keep[:8]}.. ({c.session_info(keep)['n_tokens']} tokens); closed the other")
        c.session_close(keep)


if __name__ == "__main__":
    main()
