"""Prompts that resemble what users ask a coding assistant, for EAGLE training
data (tools/eagle_data.py) and its held-out evaluation (bench/eagle/bench_chat.py).

Each prompt is (system or None, user text). They are built from the lists
below by a seeded shuffle; `prompts(n, seed)` gives the training set and
`held_out()` a fixed evaluation set whose tasks, snippets and documents are
kept out of the training set's combinations (the same kinds of request, not
the same requests).
"""
import random

LANGS = ["Python", "JavaScript", "TypeScript", "C", "C++", "Rust", "Go", "Java", "Bash", "SQL"]

TASKS = [
    "reverses the words in a sentence",
    "checks whether a string is a palindrome, ignoring case and punctuation",
    "returns the n-th Fibonacci number iteratively",
    "merges two sorted lists into one sorted list",
    "counts how often each word occurs in a text",
    "parses a date in the form YYYY-MM-DD and returns the day of the week",
    "removes duplicate elements from a list while keeping their order",
    "computes the greatest common divisor of two integers",
    "reads a CSV file and prints the sum of the second column",
    "flattens a nested list of arbitrary depth",
    "validates an e-mail address with a regular expression",
    "implements binary search over a sorted array",
    "converts a Roman numeral to an integer",
    "finds the longest common prefix of a list of strings",
    "implements a stack with push, pop and peek",
    "retries a function call up to three times with exponential backoff",
    "computes the moving average of a list of numbers with a given window",
    "splits a list into chunks of a given size",
    "returns the k most frequent elements of a list",
    "checks whether parentheses in an expression are balanced",
    "converts a string from snake_case to camelCase",
    "downloads a web page and counts the links in it",
    "implements an LRU cache with a fixed capacity",
    "serializes a binary tree to a string and back",
    "computes the Levenshtein distance between two strings",
    "groups anagrams from a list of words",
    "rotates a matrix by 90 degrees clockwise",
    "finds all prime numbers below n with the sieve of Eratosthenes",
    "formats a number of bytes as a human-readable size (KB, MB, GB)",
    "walks a directory tree and lists the files larger than 1 MB",
]
HELD_OUT_TASKS = [
    "checks whether two strings are anagrams of each other",
    "returns the second largest number in a list",
    "converts a temperature from Celsius to Fahrenheit and back",
    "implements a queue using two stacks",
]

SNIPPETS = [
    ("Python", "def f(xs):\n    out = {}\n    for x in xs:\n        out[x] = out.get(x, 0) + 1\n"
               "    return sorted(out.items(), key=lambda kv: -kv[1])"),
    ("Python", "import os\n\ndef total_size(path):\n    size = 0\n    for root, dirs, files in "
               "os.walk(path):\n        for name in files:\n            size += os.path.getsize("
               "os.path.join(root, name))\n    return size"),
    ("JavaScript", "function debounce(fn, ms) {\n  let t;\n  return (...args) => {\n"
                   "    clearTimeout(t);\n    t = setTimeout(() => fn(...args), ms);\n  };\n}"),
    ("JavaScript", "const users = await fetch('/api/users').then(r => r.json());\n"
                   "const active = users.filter(u => u.active).map(u => u.name);\n"
                   "console.log(active.join(', '));"),
    ("C", "int count_bits(unsigned x) {\n    int n = 0;\n    while (x) {\n        x &= x - 1;\n"
          "        n++;\n    }\n    return n;\n}"),
    ("C", "char *dup(const char *s) {\n    char *p = malloc(strlen(s));\n    strcpy(p, s);\n"
          "    return p;\n}"),
    ("Rust", "fn mean(v: &[f64]) -> Option<f64> {\n    if v.is_empty() {\n        return None;\n"
             "    }\n    Some(v.iter().sum::<f64>() / v.len() as f64)\n}"),
    ("Go", "func worker(jobs <-chan int, results chan<- int) {\n\tfor j := range jobs {\n"
           "\t\tresults <- j * 2\n\t}\n}"),
    ("SQL", "SELECT c.name, COUNT(o.id) AS orders\nFROM customers c\nLEFT JOIN orders o ON "
            "o.customer_id = c.id\nGROUP BY c.name\nHAVING COUNT(o.id) > 5\nORDER BY orders DESC;"),
    ("Python", "class Account:\n    def __init__(self, balance=0):\n        self.balance = balance\n"
               "\n    def withdraw(self, amount):\n        self.balance -= amount\n"
               "        return self.balance"),
    ("Bash", "for f in *.log; do\n  gzip \"$f\"\ndone\nfind . -name '*.gz' -mtime +30 -delete"),
    ("Java", "public int sum(List<Integer> xs) {\n    int s = 0;\n    for (int i = 0; i <= xs.size(); "
             "i++) {\n        s += xs.get(i);\n    }\n    return s;\n}"),
    ("TypeScript", "interface Item { id: number; price: number; qty: number }\n"
                   "export function total(items: Item[]): number {\n"
                   "  return items.reduce((s, i) => s + i.price * i.qty, 0);\n}"),
    ("Python", "def read_config(path):\n    f = open(path)\n    data = f.read()\n"
               "    return dict(line.split('=') for line in data.splitlines())"),
]
HELD_OUT_SNIPPETS = [
    ("Python", "def chunks(xs, n):\n    return [xs[i:i + n] for i in range(0, len(xs), n)]"),
    ("C", "void swap(int *a, int *b) {\n    int t = *a;\n    *a = *b;\n    *b = t;\n}"),
]

EXPLAIN = [
    "Explain what this {lang} code does:\n\n```{lang_l}\n{code}\n```",
    "What is the time complexity of this code, and why?\n\n```{lang_l}\n{code}\n```",
    "Is there a bug in this {lang} code? If so, explain it.\n\n```{lang_l}\n{code}\n```",
    "Walk me through this code line by line.\n\n```{lang_l}\n{code}\n```",
]
EDIT = [
    "Add comments to this code:\n\n```{lang_l}\n{code}\n```",
    "Refactor this {lang} code to be more readable:\n\n```{lang_l}\n{code}\n```",
    "Add error handling to the following code:\n\n```{lang_l}\n{code}\n```",
    "Rewrite this code in {other}:\n\n```{lang_l}\n{code}\n```",
    "Write unit tests for this function:\n\n```{lang_l}\n{code}\n```",
    "Rename the variables in this code to descriptive names and return the full code:\n\n"
    "```{lang_l}\n{code}\n```",
]
WRITE = [
    "Write a {lang} function that {task}.",
    "In {lang}, how do I write code that {task}?",
    "Give me a {lang} program that {task}, with a short explanation.",
    "Implement something in {lang} that {task}. Keep it short.",
]

DOCS = [
    ("release notes",
     "Version 2.4 adds a --dry-run flag to the deploy command, which prints the actions it would "
     "take without executing them. The config key `retries` now defaults to 3 instead of 5. "
     "Support for Python 3.7 was removed; the minimum is now 3.9. A bug where the cache was not "
     "cleared after a failed upload was fixed. The `sync` subcommand is deprecated and will be "
     "removed in 3.0; use `push --all` instead.",
     ["What is the new default for retries?", "Which Python versions are supported?",
      "What should I use instead of sync?", "Summarize the changes in three bullet points."]),
    ("API documentation",
     "GET /v1/orders/{id} returns one order as JSON: id (string), status (one of pending, paid, "
     "shipped, cancelled), items (array of {sku, qty}), and created_at (ISO 8601). It answers 404 "
     "if no order has that id and 401 without a valid bearer token. Rate limit: 100 requests per "
     "minute per token; above that the server answers 429 with a Retry-After header.",
     ["What happens if I exceed the rate limit?", "Which statuses can an order have?",
      "Write a curl command that fetches order 42.", "What does the endpoint return on success?"]),
    ("a README",
     "tinyq is a job queue backed by SQLite. Install it with `pip install tinyq`. Create a queue "
     "with `q = tinyq.Queue('jobs.db')`, add work with `q.put({'task': 'resize', 'file': 'a.png'})` "
     "and take it with `job = q.get(timeout=5)`. A job that is not acknowledged with `q.ack(job)` "
     "within 60 seconds is handed out again. Run `tinyq stats jobs.db` to see pending and failed "
     "counts.",
     ["How do I install tinyq?", "What happens to a job that is not acknowledged?",
      "Write a small worker loop using tinyq.", "How can I see how many jobs failed?"]),
    ("an error log",
     "2024-05-02 10:14:03 ERROR db: connection refused (host=10.0.0.5 port=5432)\n"
     "2024-05-02 10:14:04 WARN  pool: retrying in 2s (attempt 1/5)\n"
     "2024-05-02 10:14:06 ERROR db: connection refused (host=10.0.0.5 port=5432)\n"
     "2024-05-02 10:14:10 INFO  db: connected\n"
     "2024-05-02 10:15:22 ERROR http: handler /report panicked: index out of range [3] with length 3",
     ["What went wrong, and when?", "Which problem still needs fixing?",
      "What port does the database use?", "Explain the last error."]),
    ("a style guide",
     "Functions are named in snake_case and classes in PascalCase. Lines are at most 100 "
     "characters. Every public function has a docstring that states what it returns. Imports are "
     "grouped: standard library, third-party, local, separated by blank lines. Never catch a bare "
     "`except:`; catch the specific exception. Prefer f-strings to % formatting.",
     ["How long may a line be?", "How should imports be ordered?",
      "Rewrite `except: pass` the way the guide wants.", "List the naming rules."]),
]
HELD_OUT_DOCS = [
    ("a changelog",
     "1.8.0: the parser now accepts trailing commas in arrays. The --color flag was renamed to "
     "--colour-mode and accepts auto, always and never. Memory use when reading large files fell "
     "by about 40 percent. Fixed a crash on empty input files.",
     ["What was the --color flag renamed to?", "Summarize this changelog."]),
]
DOC_Q = [
    "Answer the question using only the {kind} below.\n\n{doc}\n\nQuestion: {q}",
    "Here is {kind}:\n\n\"\"\"\n{doc}\n\"\"\"\n\n{q}",
]

TOOLS = [
    ("get_weather", "{\"city\": string, \"unit\": \"celsius\" | \"fahrenheit\"}",
     ["What's the weather in Paris?", "Is it cold in Oslo right now, in fahrenheit?",
      "Tell me the temperature in Tokyo."]),
    ("search_files", "{\"pattern\": string, \"directory\": string}",
     ["Find all Python files under src.", "Look for files named config.yaml in /etc.",
      "Which markdown files are in docs?"]),
    ("run_sql", "{\"query\": string}",
     ["How many users signed up in March?", "List the five most expensive products.",
      "Delete the orders older than 2020."]),
    ("create_issue", "{\"title\": string, \"body\": string, \"labels\": [string]}",
     ["Open an issue about the login page crashing on Safari.",
      "File a bug: the export button does nothing; label it ui.",
      "Create a ticket to update the README installation section."]),
    ("send_email", "{\"to\": string, \"subject\": string, \"body\": string}",
     ["Email bob@example.com that the build is fixed.",
      "Send the team a reminder about Friday's release."]),
]
HELD_OUT_TOOLS = [
    ("get_stock_price", "{\"symbol\": string}", ["What is Apple's stock price?"]),
]
TOOL_SYSTEM = ("You are an assistant that calls tools. Available tool: {name}, arguments {schema}. "
               "Answer with a JSON object {{\"name\": ..., \"arguments\": {{...}}}} and nothing else.")

GENERAL = [
    "What is the difference between a process and a thread?",
    "Explain what a race condition is, with an example.",
    "How do I undo the last git commit but keep the changes?",
    "What does `git rebase -i` do?",
    "Explain the difference between TCP and UDP.",
    "What is a closure in JavaScript?",
    "When should I use a hash map instead of a list?",
    "Explain Big-O notation in simple terms.",
    "How do I create a virtual environment in Python?",
    "What is dependency injection?",
    "Write a regular expression that matches IPv4 addresses.",
    "How do I find which process is using port 8080 on Linux?",
    "What is the difference between `==` and `is` in Python?",
    "Explain what a Docker volume is.",
    "Write a SQL query that finds duplicate e-mail addresses in a users table.",
    "How do I read a file line by line in Go?",
    "What does the `volatile` keyword mean in C?",
    "Explain async and await in Python.",
    "Write a Makefile that builds main.c and util.c into a program called app.",
    "How do I make an HTTP POST request with JSON in Python?",
]
HELD_OUT_GENERAL = [
    "What is the difference between a shallow copy and a deep copy?",
    "How do I list the ten largest files in a directory on Linux?",
]


def _lang_l(lang):
    return {"C++": "cpp", "Bash": "bash"}.get(lang, lang.lower())


def _build(tasks, snippets, docs, tools, general, rng):
    out = []
    for t in tasks:
        for tmpl in WRITE:
            out.append((None, tmpl.format(lang=rng.choice(LANGS), task=t)))
    for lang, code in snippets:
        for tmpl in EXPLAIN + EDIT:
            other = rng.choice([x for x in LANGS if x not in (lang, "SQL", "Bash")])
            out.append((None, tmpl.format(lang=lang, lang_l=_lang_l(lang), code=code, other=other)))
    for kind, doc, qs in docs:
        for q in qs:
            for tmpl in DOC_Q:
                out.append((None, tmpl.format(kind=kind, doc=doc, q=q)))
    for name, schema, asks in tools:
        for ask in asks:
            out.append((TOOL_SYSTEM.format(name=name, schema=schema), ask))
    for g in general:
        out.append((None, g))
    return out


def prompts(n, seed):
    """n training prompts (system or None, user), a seeded sample of all kinds."""
    rng = random.Random(seed)
    allp = _build(TASKS, SNIPPETS, DOCS, TOOLS, GENERAL, rng)
    rng.shuffle(allp)
    return allp[:n]


def held_out():
    """The evaluation prompts: one or two of each kind, none seen in training."""
    rng = random.Random(12345)
    tasks = [(None, WRITE[i % len(WRITE)].format(lang=LANGS[(3 * i) % len(LANGS)], task=t))
             for i, t in enumerate(HELD_OUT_TASKS[:2])]
    lang, code = HELD_OUT_SNIPPETS[0]
    explain = [(None, EXPLAIN[0].format(lang=lang, lang_l=_lang_l(lang), code=code))]
    lang, code = HELD_OUT_SNIPPETS[1]
    edit = [(None, EDIT[1].format(lang=lang, lang_l=_lang_l(lang), code=code, other="Rust"))]
    kind, doc, qs = HELD_OUT_DOCS[0]
    docq = [(None, DOC_Q[0].format(kind=kind, doc=doc, q=qs[0]))]
    name, schema, asks = HELD_OUT_TOOLS[0]
    tool = [(TOOL_SYSTEM.format(name=name, schema=schema), asks[0])]
    gen = [(None, HELD_OUT_GENERAL[0])]
    del rng
    return tasks + explain + edit + docq + tool + gen
