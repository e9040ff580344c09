#!/usr/bin/env python3
"""Many questions over one long document.

Every request is "document + question". The first one computes the
document's KV; every later one finds it in the cache, which the server
reports as usage.cached_tokens: watch it jump from 0 to (almost) the whole
document after the first question.

    python3 clients/python/examples/rag.py --spawn build/cairn
    python3 clients/python/examples/rag.py --addr 127.0.0.1:7077 --doc my.txt
"""
import os
import time

from _connect import ROOT, Connection, parser

QUESTIONS = [
    "Who is the story about?",
    "What was stuck in the mud?",
    "Who came to help?",
    "How did the story end?",
    "What colour was the ball?",
    "Where did the dog live?",
]


def main():
    ap = parser(__doc__.split("\n\n")[0])
    ap.add_argument("--doc", default=os.path.join(ROOT, "tests", "data", "text", "stories.txt"))
    ap.add_argument("--doc-chars", type=int, default=3000,
                    help="use this much of the document (the bundled model's context is 2048 "
                         "tokens)")
    ap.add_argument("--max-tokens", type=int, default=24)
    args = ap.parse_args()
    with open(args.doc) as f:
        document = f.read()[: args.doc_chars]

    with Connection(args) as c:
        info = c.info()
        n_doc = len(c.tokenize(document))
        print(f"model {info['model']['name']} (n_ctx {info['model']['n_ctx']}), "
              f"page size {info['page_size']}; document: {n_doc} tokens\n")
        print(f"{'question':<28} {'prompt':>6} {'cached':>6} {'ms':>7}  answer")
        for q in QUESTIONS:
            t0 = time.perf_counter()
            r = c.generate(prompt=f"{document}\nQuestion: {q}\nAnswer:",
                           max_tokens=args.max_tokens, temperature=0)
            ms = 1000 * (time.perf_counter() - t0)
            answer = r.text.strip().replace("\n", " ")[:60]
            print(f"{q:<28} {r.usage.prompt_tokens:>6} {r.usage.cached_tokens:>6} {ms:>7.1f}  "
                  f"{answer}")
        s = c.cache_stats()
        print(f"\nserver-wide: {s['cached_tokens']} of {s['prompt_tokens']} prompt tokens "
              f"came from the cache (hit rate {s['hit_rate']:.2f})")


if __name__ == "__main__":
    main()
