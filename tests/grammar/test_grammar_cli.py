#!/usr/bin/env python3
"""Structured output end to end on the bundled model, sampling at temperature
1.0: `cairn run --json-schema FILE` / `--json`, and `response_format` through
`cairn serve` and the Python client (the schema as a msgpack map and as JSON
text, json_object, and streaming). For every seed and schema the output must
parse as JSON and validate with the jsonschema package (an implementation
independent of cairn's). Bad schemas are refused: before the model loads
(CLI) or with an invalid_request error (server)."""
import json
import os
import subprocess
import sys
import tempfile

try:
    import jsonschema
except ImportError:
    print("skipped: the Python package 'jsonschema' is not installed (scripts/setup.sh --test)")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import SHORT_HANG_GUARD_S, Server  # noqa: E402
import cairn_client  # noqa: E402

CAIRN, MODEL = harness.take_argv("CAIRN_BIN", "MODEL")

# Bounded schemas (strings have maxLength, arrays maxItems), so every document
# ends well within the token budget and must finish with "stop".
SCHEMAS = [
    {"type": "object",
     "properties": {"name": {"type": "string", "maxLength": 10},
                    "age": {"type": "integer"},
                    "happy": {"type": "boolean"},
                    "pets": {"type": "array", "maxItems": 3,
                             "items": {"enum": ["cat", "dog", "bird"]}}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "array", "minItems": 2, "maxItems": 4,
     "items": {"anyOf": [{"type": "number"}, {"type": "null"},
                         {"type": "string", "minLength": 1, "maxLength": 4}]}},
    {"$defs": {"point": {"type": "object",
                         "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                         "required": ["x", "y"]}},
     "type": "object",
     "properties": {"kind": {"const": "line"},
                    "from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"}},
     "required": ["kind", "from", "to"]},
    # bounds, pattern, format and prefixItems, as pydantic v2 writes them
    # (Field(ge=1, le=10), confloat(ge=0, lt=1.5), constr(pattern=...),
    # date / datetime / UUID, tuple[int, str])
    {"type": "object",
     "properties": {"guests": {"type": "integer", "minimum": 1, "maximum": 10},
                    "rate": {"type": "number", "minimum": 0, "exclusiveMaximum": 1.5},
                    "code": {"type": "string", "pattern": "^[A-Z]{3}-\\d{2,4}$"},
                    "day": {"type": "string", "format": "date"},
                    "when": {"type": "string", "format": "date-time"},
                    "ref": {"type": "string", "format": "uuid"},
                    "pair": {"type": "array", "minItems": 2, "maxItems": 2,
                             "prefixItems": [{"type": "integer", "exclusiveMinimum": 0},
                                             {"type": "string", "maxLength": 3}]}},
     "required": ["guests", "rate", "code", "day", "when", "ref", "pair"]},
    {"type": "array", "minItems": 1, "maxItems": 3,
     "items": {"anyOf": [{"type": "integer", "exclusiveMinimum": -5, "exclusiveMaximum": 5},
                         {"type": "string", "format": "ipv4"},
                         {"type": "string", "pattern": "x", "maxLength": 4}]}},
]


def validate(doc, schema):
    """jsonschema's validation, formats checked too."""
    jsonschema.validate(doc, schema, format_checker=jsonschema.FormatChecker())


def run(args):
    return subprocess.run([CAIRN, "run", "-m", MODEL, "-p", "Once upon a time",
                           "--temp", "1.0"] + args,
                          capture_output=True, text=True, timeout=SHORT_HANG_GUARD_S)


def check_server():
    """response_format through the msgpack protocol; returns the failures."""
    failures = 0
    server = Server(CAIRN, ["-m", MODEL], tcp=True, start_timeout=SHORT_HANG_GUARD_S)
    try:
        c = server.client(timeout=SHORT_HANG_GUARD_S)
        for k, schema in enumerate(SCHEMAS):
            for seed in range(1, 5):
                # as JSON text: these nest deeper than max_depth allows a map
                rf = {"type": "json_schema",
                      "json_schema": {"name": f"s{k}", "schema": json.dumps(schema)}}
                r = c.generate("Once upon a time", max_tokens=400, temperature=1.0, seed=seed,
                               response_format=rf)
                try:
                    if r.finish_reason != "stop":
                        raise ValueError(f"finish_reason {r.finish_reason}")
                    validate(json.loads(r.text), schema)
                except Exception as e:  # noqa: BLE001
                    print(f"server schema {k} seed {seed}: {e}\ntext: {r.text!r}")
                    failures += 1
        # a flat schema fits max_depth as a msgpack map
        flat = {"type": "object", "properties": {"n": {"type": "integer"},
                                                 "ok": {"type": "boolean"}},
                "required": ["n", "ok"]}
        for seed in range(1, 4):
            r = c.generate("Once upon a time", max_tokens=100, temperature=1.0, seed=seed,
                           response_format={"type": "json_schema",
                                            "json_schema": {"schema": flat}})
            try:
                jsonschema.validate(json.loads(r.text), flat)
            except Exception as e:  # noqa: BLE001
                print(f"server flat map schema seed {seed}: {e}\ntext: {r.text!r}")
                failures += 1
        # streaming: the deltas add up to the same valid document
        stream = c.generate("Once upon a time", max_tokens=400, temperature=1.0, seed=11,
                            stream=True,
                            response_format={"type": "json_schema",
                                             "json_schema": {"schema": json.dumps(SCHEMAS[0])}})
        items = list(stream)  # the deltas, then the result
        pieces = [d.text for d in items[:-1]]
        r = items[-1]
        if "".join(pieces) != r.text:
            print(f"stream: deltas {''.join(pieces)!r} != text {r.text!r}")
            failures += 1
        jsonschema.validate(json.loads(r.text), SCHEMAS[0])
        r = c.generate("Once upon a time", max_tokens=60, temperature=1.0, seed=3,
                       response_format={"type": "json_object"})
        if r.finish_reason == "stop" and not isinstance(json.loads(r.text), dict):
            print(f"json_object: {r.text!r}")
            failures += 1
        for bad in ({"type": "json_schema", "json_schema": {"schema": {"pattern": "(?=x)"}}},
                    {"type": "json_schema", "json_schema": {"schema": "{not json"}},
                    {"type": "xml"}):
            try:
                c.generate("Once upon a time", max_tokens=5, response_format=bad)
                print(f"bad response_format {bad} was accepted")
                failures += 1
            except cairn_client.InvalidRequest:
                pass
        if not server.alive():
            print("the server died:\n" + server.log())
            failures += 1
        c.close()
    finally:
        server.stop()
    return failures


def main():
    failures = check_server()
    with tempfile.TemporaryDirectory() as d:
        for k, schema in enumerate(SCHEMAS):
            path = os.path.join(d, f"s{k}.json")
            with open(path, "w") as f:
                json.dump(schema, f)
            for seed in range(1, 9):
                p = run(["--seed", str(seed), "-n", "400", "--json-schema", path])
                if p.returncode != 0:
                    print(f"schema {k} seed {seed}: exit {p.returncode}: {p.stderr[-400:]}")
                    failures += 1
                    continue
                if "finish: stop" not in p.stderr:
                    print(f"schema {k} seed {seed}: did not finish: {p.stderr[-300:]}")
                    failures += 1
                try:
                    doc = json.loads(p.stdout)
                    validate(doc, schema)
                except Exception as e:  # noqa: BLE001 - report any failure
                    print(f"schema {k} seed {seed}: {e}\noutput: {p.stdout!r}")
                    failures += 1
        # --json: any object; free strings may run to -n, so only a finished
        # document is required to parse
        finished = 0
        for seed in range(1, 6):
            p = run(["--seed", str(seed), "-n", "200", "--json"])
            if p.returncode != 0:
                print(f"--json seed {seed}: exit {p.returncode}")
                failures += 1
            elif "finish: stop" in p.stderr:
                finished += 1
                if not isinstance(json.loads(p.stdout), dict):
                    print(f"--json seed {seed}: not an object: {p.stdout!r}")
                    failures += 1
        print(f"--json: {finished} of 5 runs finished their object")
        # refused schemas: exit 2 with the keyword named, before loading
        bad = os.path.join(d, "bad.json")
        with open(bad, "w") as f:
            json.dump({"type": "string", "pattern": "^(a)\\1$"}, f)
        p = run(["--json-schema", bad])
        if p.returncode != 2 or "backreferences" not in p.stderr:
            print(f"bad schema: exit {p.returncode}, stderr {p.stderr!r}")
            failures += 1
    if failures:
        print(f"{failures} failures")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
