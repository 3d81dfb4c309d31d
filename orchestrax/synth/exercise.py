"""Exercise every tool of a domain once: sample argument sets from the domain's own DB until one
call succeeds. Used to validate a domain (the released ones, or code the pipeline generated).

Arguments are drawn from one DB record at a time (the one holding most of the tool's parameter
names as fields, so ids that belong together, a client and its account, come together), then
from any record with a field of that name, then from the keys of a table named after the
parameter (`client_id` -> `clients`), then from the schema alone (enum member, type default).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
from typing import Any, Iterator

import numpy as np

from orchestrax.tools.domain_worker import DomainWorker


_AFFIXES = ("from_", "to_", "new_", "old_", "source_", "target_", "allowed_")


def _core(name: str) -> str:
    """`from_account_id` -> `account`, `course_ids` -> `course`, `unit_skus` -> `unit_sku`."""
    for prefix in _AFFIXES:
        if name.startswith(prefix):
            name = name[len(prefix):]
    for suffix in ("_ids", "_refs", "_id", "_ref", "_key", "s"):
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[:-len(suffix)]
    return name


def _collect(node: Any, pool: dict[str, list[Any]], under: str | None) -> None:
    """Field name -> scalar values in `node`'s subtree; the keys of a mapping count as values of
    the name it sits under (`accounts: {id: ...}` gives `accounts` its ids)."""
    if isinstance(node, dict):
        keyed = all(isinstance(v, dict) for v in node.values()) and under is not None and node
        for k, v in node.items():
            if keyed:
                pool.setdefault(under, []).append(k)
            if isinstance(v, (dict, list)):
                pool.setdefault(k, []).append(v)  # a nested value may be an argument as a whole
                _collect(v, pool, k)
            elif v is not None:
                pool.setdefault(k, []).append(v)
    elif isinstance(node, list):
        for v in node:
            if isinstance(v, (dict, list)):
                _collect(v, pool, under)
            elif v is not None:
                pool.setdefault(under, []).append(v)


def _by_core(pool: dict[str, list[Any]]) -> dict[str, dict[str, list[Any]]]:
    out: dict[str, dict[str, list[Any]]] = {}
    for name, values in pool.items():
        out.setdefault(_core(name), {})[name] = values
    return out


_EXAMPLE = re.compile(r"(?:such as|e\.g\.,?|example:?|like)\s*['\"`]([^'\"`]+)['\"`]", re.I)


@dataclasses.dataclass
class ArgumentSampler:
    db: dict[str, Any]
    rng: np.random.Generator

    def __post_init__(self):
        self.entries: list[dict[str, dict[str, list[Any]]]] = []
        self.words: list[set[str]] = []  # each entry's short string values, lower case
        self.keys: list[tuple[str, str]] = []
        everything: dict[str, list[Any]] = {}
        for table, rows in self.db.items():
            if not isinstance(rows, dict):
                continue
            for key, row in rows.items():
                pool: dict[str, list[Any]] = {table: [key]}
                _collect(row, pool, None)
                self.entries.append(_by_core(pool))
                self.keys.append((table, key))
                self.words.append({v.lower() for vs in pool.values() for v in vs
                                   if isinstance(v, str) and len(v) < 20})
                for k, v in pool.items():
                    everything.setdefault(k, []).extend(v)
        self.everything = _by_core(everything)
        # an entry's foreign keys: the entries of other tables whose key it holds as a value
        owner = {}
        for i, (table, key) in enumerate(self.keys):
            owner.setdefault(key, i)
        self.joined = [sorted({owner[v] for names in e.values() for vs in names.values()
                               for v in vs if isinstance(v, str) and owner.get(v, i) != i})
                       for i, e in enumerate(self.entries)]

    def _pick(self, items: list[Any]) -> Any:
        return items[int(self.rng.integers(len(items)))]

    @staticmethod
    def _fits(schema: dict[str, Any], value: Any) -> bool:
        if schema.get("enum"):
            return value in schema["enum"]
        options = schema.get("anyOf") or schema.get("oneOf")
        if options:
            return any(ArgumentSampler._fits(o, value) for o in options)
        checks = {"string": str, "integer": int, "number": (int, float), "boolean": bool,
                  "null": type(None), "object": dict, "array": list}
        kind = schema.get("type")
        if kind not in checks:
            return True
        if not isinstance(value, checks[kind]) or (kind != "boolean" and isinstance(value, bool)):
            return False
        if kind == "object" and schema.get("properties"):  # a record, not a mapping of them
            return set(schema.get("required") or schema["properties"]) <= value.keys()
        if kind == "array" and isinstance(schema.get("items"), dict):
            return all(ArgumentSampler._fits(schema["items"], v) for v in value)
        return True

    def _lookup(self, pools: dict[str, dict[str, list[Any]]], name: str,
                schema: dict[str, Any]) -> list[Any]:
        core = _core(name)
        names = pools.get(core, {})
        exact = [v for v in names.get(name, []) if self._fits(schema, v)]
        same = exact or [v for vs in names.values() for v in vs if self._fits(schema, v)]
        # `payment_id` also matches `payment_method_id` values, never the other way round
        return same or [v for c, ns in pools.items() if c.startswith(core + "_")
                        for vs in ns.values() for v in vs if self._fits(schema, v)]

    def _value(self, schema: dict[str, Any], name: str, entry: int | None) -> Any:
        options = [o for o in (schema.get("anyOf") or schema.get("oneOf") or []) if
                   o.get("type") != "null"]
        if options:  # a typed model before a bare dict or string
            options.sort(key=lambda o: not o.get("properties"))
            schema = {**options[0], **{k: v for k, v in schema.items()
                                       if k not in ("anyOf", "oneOf")}}
        kind = schema.get("type")
        scopes = ([] if entry is None else [self.entries[entry]]
                  + [self.entries[j] for j in self.joined[entry]])
        for pools in (*scopes, self.everything):
            found = self._lookup(pools, name, schema)
            if found:
                return self._pick(found)
        if kind == "array":
            items = schema.get("items") or {}
            return [self._value(items, name, entry)]
        if kind == "object" and schema.get("properties"):
            return {k: self._value(s, k, entry) for k, s in schema["properties"].items()}
        token = name.rsplit("_", 1)[-1]  # `start_utc`: any `*_utc` field
        found = [v for core, names in self.everything.items() for n, vs in names.items()
                 if n == token or n.endswith("_" + token) for v in vs if self._fits(schema, v)]
        if found and len(token) > 2:
            return self._pick(found)
        if schema.get("enum"):
            return self._pick(schema["enum"])
        example = _EXAMPLE.search(schema.get("description") or "")
        if kind in (None, "string") and example:
            return example.group(1)
        if kind in (None, "string") and name == "expression":
            return "2 + 2"
        return {"integer": 1, "number": 1.0, "boolean": False, "null": None}.get(kind, "test")

    def sample(self, parameters: dict[str, Any], tool: str = "") -> dict[str, Any]:
        """One argument set for a tool with JSON-schema `parameters`: every required field and
        the optional ones the chosen DB entry has values for. Entries with a value that is a
        word of the tool's name (`cancel_pending_sale`: status "pending") are preferred."""
        props = parameters.get("properties") or {}
        required = set(parameters.get("required") or [])
        cores = {_core(n) for n in props}
        words = set(tool.split("_")) - {"get", "set", "update", "add", "list", "by", "for"}
        scores = [2 * len(cores & e.keys()) + bool(words & w)
                  for e, w in zip(self.entries, self.words)]
        best = max(scores, default=0)
        entry = self._pick([i for i, s in enumerate(scores) if s == best]) if best else None
        return {name: self._value(schema, name, entry) for name, schema in props.items()
                if name in required or (entry is not None and _core(name) in self.entries[entry])}


async def exercise(worker: DomainWorker, descriptions: list[dict[str, Any]], *,
                   attempts: int = 40, seed: int = 0) -> dict[str, dict[str, Any]]:
    """Per tool: {"ok", "arguments", "observation", "attempts"} of its first successful call
    (or the last failure). Every call starts from db.json (the worker is reset first)."""
    db = json.loads((pathlib.Path(worker.folder) / "db.json").read_text())
    sampler = ArgumentSampler(db, np.random.default_rng(seed))
    out = {}
    for d in descriptions:
        for k in range(1, attempts + 1):
            args = sampler.sample(d["parameters"], d["name"])
            await worker.request({"op": "reset"})
            reply = await worker.request({"op": "call", "name": d["name"], "arguments": args})
            out[d["name"]] = {"ok": reply["ok"], "arguments": args, "attempts": k,
                              "observation": reply.get("result", reply.get("error"))}
            if reply["ok"]:
                break
    return out
