#!/usr/bin/env python3
"""The structured-output JSON Schema compiler (common/structured/json_schema_regex) against the
`jsonschema` package, property-test style, for a list of schemas of the supported subset:

  - soundness: random texts the compiled automaton accepts (structured_tool's samples) parse as
    JSON and validate against the schema;
  - completeness on the generated shape: random instances built here from the schema (properties
    in schema order, optional ones sometimes left out), dumped compact and as json.dumps does by
    default, validate (jsonschema) and match;
  - mutations of those instances (a value replaced by another JSON value, a key dropped) that
    jsonschema finds invalid never match.
Plus: schemas outside the subset are refused as unsupported, malformed ones as invalid.
Every expectation comes from jsonschema at test time. Exits non-zero on any mismatch.
"""

import copy
import json
import random
import re
import sys

import jsonschema

from structured_tool import StructuredTool

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer"},
        "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]},
                 "maxItems": 3},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
SCHEMAS = [
    PERSON,
    {"type": "integer"},
    {"type": "number"},
    {"type": "boolean"},
    {"type": "null"},
    {"type": ["string", "null"], "maxLength": 5},
    {"enum": ["red", "green", 3, None, {"a": 1}]},
    {"const": "fixed"},
    {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4},
    {"type": "array", "items": {"type": "number"}},
    {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "null"},
                                      "c": {"type": "integer"}}},
    {"type": "object", "properties": {"x": {"anyOf": [{"type": "integer"},
                                                      {"type": "string", "maxLength": 3}]}},
     "required": ["x"]},
    {"oneOf": [{"type": "object", "properties": {"kind": {"const": "circle"},
                                                 "r": {"type": "number"}},
                "required": ["kind", "r"], "additionalProperties": False},
               {"type": "object", "properties": {"kind": {"const": "square"},
                                                 "side": {"type": "integer"}},
                "required": ["kind", "side"], "additionalProperties": False}]},
    {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"},
                                                          "y": {"type": "integer"}},
                         "required": ["x", "y"], "additionalProperties": False}},
     "type": "object", "properties": {"from": {"$ref": "#/$defs/point"},
                                      "to": {"$ref": "#/$defs/point"}},
     "required": ["from", "to"], "additionalProperties": False},
    {"type": "object", "properties": {"outer": {"type": "object", "properties": {
        "inner": {"type": "array", "items": {"type": "object", "properties": {
            "v": {"type": "string", "enum": ["p", "q"]}}, "required": ["v"]}}},
        "required": ["inner"]}}, "required": ["outer"]},
    {"type": "object", "additionalProperties": {"type": "integer"}},
    {"type": "object"},
    {"type": "object", "properties": {"s": {"type": "string", "pattern": "ab+"}},
     "required": ["s"]},
    {"type": "string", "minLength": 2, "maxLength": 2},
    {"allOf": [{"type": "integer"}]},
]
UNSUPPORTED = [
    {"type": "integer", "minimum": 0},
    {"type": "string", "format": "date"},
    {"type": "array", "uniqueItems": True},
    {"not": {"type": "null"}},
    {"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, "$ref": "#/$defs/n"},
    {"type": "object", "patternProperties": {"a": {}}},
    {"$ref": "http://example.com/schema"},
    {"type": "string", "pattern": "(?=a)"},
]
INVALID = [
    {"type": "frobnicate"},
    {"enum": []},
    {"type": "string", "minLength": 3, "maxLength": 2},
    {"$ref": "#/$defs/missing"},
    {"type": "string", "pattern": "("},
]

POOL = [0, -7, 1.5, "x", "toolong-string-value", None, True, [], {}, [1, "a"], {"k": 1}]


def gen(schema, rng, root, depth=0):
    """A random instance of the schema, in the shape the compiler generates."""
    if "$ref" in schema:
        return gen(root["$defs"][schema["$ref"].split("/")[-1]], rng, root, depth)
    if "const" in schema:
        return copy.deepcopy(schema["const"])
    if "enum" in schema:
        return copy.deepcopy(rng.choice(schema["enum"]))
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return gen(rng.choice(schema[key]), rng, root, depth)
    if "allOf" in schema:
        return gen(schema["allOf"][0], rng, root, depth)
    t = schema.get("type")
    if isinstance(t, list):
        t = rng.choice(t)
    if t == "integer":
        return rng.choice([0, 1, -5, 42, 123456789])
    if t == "number":
        return rng.choice([0, 2.5, -0.125, 7, 1e-05, 31.0])
    if t == "boolean":
        return rng.choice([True, False])
    if t == "null":
        return None
    if t == "string":
        lo, hi = schema.get("minLength", 0), schema.get("maxLength", 8)
        if "pattern" in schema:
            return None  # left to the automaton's samples
        return "".join(rng.choice("abcé \"\\/") for _ in range(rng.randint(lo, hi)))
    if t == "array":
        lo, hi = schema.get("minItems", 0), schema.get("maxItems", 3)
        items = schema.get("items", {"type": "integer"})
        return [gen(items, rng, root, depth + 1) for _ in range(rng.randint(lo, hi))]
    if t == "object":
        props = schema.get("properties")
        if props is None:
            extra = schema.get("additionalProperties", {"type": "string"})
            if extra is True:
                extra = {"type": "string"}
            return {f"k{i}": gen(extra, rng, root, depth + 1) for i in range(rng.randint(0, 2))}
        out = {}
        for name, sub in props.items():
            if name in schema.get("required", []) or rng.random() < 0.5:
                v = gen(sub, rng, root, depth + 1)
                if v is None and sub.get("type") == "string":
                    if name in schema.get("required", []):
                        return None
                    continue
                out[name] = v
        return out
    return None


def mutate(inst, rng):
    inst = copy.deepcopy(inst)
    nodes = [(None, None, inst)]

    def walk(v):
        if isinstance(v, dict):
            for k in v:
                nodes.append((v, k, v[k]))
                walk(v[k])
        elif isinstance(v, list):
            for i in range(len(v)):
                nodes.append((v, i, v[i]))
                walk(v[i])
    walk(inst)
    parent, key, _ = rng.choice(nodes)
    if isinstance(parent, dict) and rng.random() < 0.3:
        del parent[key]
        return inst
    if parent is None:
        return copy.deepcopy(rng.choice(POOL))
    parent[key] = copy.deepcopy(rng.choice(POOL))
    return inst


def main():
    tool = StructuredTool()
    failures = 0
    counts = {"samples": 0, "generated": 0, "mutants": 0}
    rng = random.Random(41)

    def fail(msg):
        nonlocal failures
        failures += 1
        if failures < 40:
            print("FAIL:", msg)

    for schema in SCHEMAS:
        validator = jsonschema.Draft202012Validator(schema)
        ans = tool.ask(op="schema", schema=schema)
        if "error" in ans:
            fail(f"{json.dumps(schema)} refused: {ans}")
            continue
        regex = ans["regex"]
        samples = tool.ask(op="sample", regex=regex, n=40, seed=7)
        if "error" in samples:
            fail(f"{json.dumps(schema)}: regex refused: {samples}")
            continue
        for text in samples["samples"]:
            counts["samples"] += 1
            try:
                value = json.loads(text)
            except ValueError as e:
                fail(f"{json.dumps(schema)}: sample {text!r} is not JSON: {e}")
                continue
            if not validator.is_valid(value):
                fail(f"{json.dumps(schema)}: sample {text!r} does not validate")
        texts, expect = [], []
        for _ in range(40):
            inst = gen(schema, rng, schema)
            if inst is None and schema.get("type") != "null" and "enum" not in schema:
                continue
            if not validator.is_valid(inst):
                fail(f"{json.dumps(schema)}: the generator made an invalid {inst!r}")
                continue
            for dump in (json.dumps(inst, separators=(",", ":")), json.dumps(inst)):
                texts.append(dump)
                expect.append(True)
                counts["generated"] += 1
            for _ in range(3):
                m = mutate(inst, rng)
                if validator.is_valid(m):
                    continue  # still valid: the compiler may or may not generate its shape
                for dump in (json.dumps(m, separators=(",", ":")), json.dumps(m)):
                    texts.append(dump)
                    expect.append(False)
                    counts["mutants"] += 1
        got = tool.ask(op="match", regex=regex, texts=texts)
        for t, want, m in zip(texts, expect, got["matches"]):
            if m != want:
                fail(f"{json.dumps(schema)}: {t!r}: matched {m}, jsonschema valid {want}")
    for schema in UNSUPPORTED:
        ans = tool.ask(op="schema", schema=schema)
        if ans.get("code") != "unsupported":
            fail(f"{json.dumps(schema)} should be unsupported: {ans}")
    for schema in INVALID:
        ans = tool.ask(op="schema", schema=schema)
        if ans.get("code") != "invalid":
            fail(f"{json.dumps(schema)} should be invalid: {ans}")
    # json_object: any object.
    ans = tool.ask(op="schema", schema={"type": "object"})
    samples = tool.ask(op="sample", regex=ans["regex"], n=30, seed=3)
    for text in samples.get("samples", []):
        if not isinstance(json.loads(text), dict):
            fail(f"json_object sample {text!r} is not an object")
    tool.close()
    print(f"{len(SCHEMAS)} schemas: {counts['samples']} automaton samples validated, "
          f"{counts['generated']} generated instances matched, {counts['mutants']} invalid "
          f"mutants refused; {len(UNSUPPORTED)} unsupported, {len(INVALID)} invalid schemas; "
          f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
