"""The program a tau2-format domain's code runs in: `domain_worker` sends this file's source to a
sandboxed interpreter (`python -I -c`). Standard library only at module level, because the host
imports it too (to read its source); tau2-bench's toolkit, pydantic and the domain's own modules
are imported inside the sandbox only.

Protocol, one JSON object per line each way. The first request is
  {"op": "load", "folder", "name", "site": [dirs for sys.path]}  -> {"ok", "tools": [...]}
then any of
  {"op": "call", "name", "arguments"}  -> {"ok": true, "result": text} | {"ok": false, "error"}
  {"op": "reset"}                      -> the DB back to db.json
  {"op": "state"}                      -> {"hash", "changed": {table: {key: entry|null}}, "touched"}
  {"op": "replay", "actions"}          -> reset, every action in order, then "state"'s reply
                                          plus "outcomes": [{"ok", "observation"}]
Every reply has "ok"; a request the worker could not serve answers {"ok": false, "error"}.
"""

import hashlib
import inspect
import json
import os
import pathlib
import sys
import types
import typing

_WHOLE = "*"  # the key of a top-level DB field that is not a table of entries


def _inline_refs(node, defs, depth=0):
    """The schema with pydantic's `$ref`s to `$defs` replaced by the definitions, so a chat
    template shows the whole argument shape."""
    if depth > 20:
        return {}
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            target = defs.get(ref[len("#/$defs/"):], {})
            merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
            return _inline_refs(merged, defs, depth + 1)
        return {k: _inline_refs(v, defs, depth + 1) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline_refs(v, defs, depth + 1) for v in node]
    return node


class _Reads(dict):
    """A DB table that records which of its keys were looked up."""

    def __getitem__(self, key):
        value = dict.__getitem__(self, key)
        self.reads.add(key)
        return value

    def get(self, key, default=None):
        if dict.__contains__(self, key):
            self.reads.add(key)
            return dict.__getitem__(self, key)
        return default

    def __setitem__(self, key, value):
        self.reads.add(key)
        dict.__setitem__(self, key, value)


def _entry_text(value):
    return json.dumps(value, sort_keys=True, default=str)


class Domain:
    def __init__(self, folder, name):
        from tau2.environment.db import DB
        from tau2.environment.environment import Environment
        from tau2.environment.tool import as_tool
        from tau2.environment.toolkit import ToolKitBase

        self.folder = pathlib.Path(folder)
        self._install_package(name)
        module = __import__(f"tau2.domains.{name}.tools", fromlist=["_"])
        kits = [c for c in vars(module).values() if inspect.isclass(c)
                and issubclass(c, ToolKitBase) and c is not ToolKitBase
                and c.__module__ == module.__name__]
        if len(kits) != 1:
            raise ValueError(f"{name}/tools.py defines {len(kits)} ToolKitBase subclasses "
                             f"({[k.__name__ for k in kits]}); expected exactly one")
        self.kit_cls = kits[0]
        self.db_cls = self._db_class(DB)
        self.as_tool, self.to_json_str = as_tool, Environment.to_json_str
        self.raw = (self.folder / "db.json").read_text()
        self.reset()
        base = self.db.model_dump()
        self.base_entries = {t: self._entries(v) for t, v in base.items()}

    def _install_package(self, name):
        """`tau2.domains.<name>` is the folder when it holds tools.py, else the wheel's own
        package of that name (retail, airline); a `utils` module the folder lacks is supplied
        with the paths tau2-bench's domains name there."""
        import tau2.domains

        pkg_name = f"tau2.domains.{name}"
        if not (self.folder / "tools.py").is_file():
            __import__(pkg_name)
            return
        pkg = types.ModuleType(pkg_name)
        pkg.__path__, pkg.__package__ = [str(self.folder)], pkg_name
        sys.modules[pkg_name] = pkg
        setattr(tau2.domains, name, pkg)
        if not (self.folder / "utils.py").is_file():
            utils = types.ModuleType(f"{pkg_name}.utils")
            upper = name.upper()
            for attr, file in (("DATA_DIR", None), ("DB_PATH", "db.json"),
                               ("POLICY_PATH", "policy.md"), ("TASK_SET_PATH", "tasks.json")):
                setattr(utils, f"{upper}_{attr}", self.folder / file if file else self.folder)
            sys.modules[utils.__name__] = utils
            pkg.utils = utils

    def _db_class(self, db_base):
        hints = {}
        for source in (self.kit_cls.__init__, self.kit_cls):
            try:
                hints = typing.get_type_hints(source)
            except Exception:
                continue
            if inspect.isclass(hints.get("db")) and issubclass(hints["db"], db_base):
                return hints["db"]
        raise ValueError(f"{self.kit_cls.__name__}: no `db: <tau2 DB subclass>` annotation")

    @staticmethod
    def _entries(value):
        if isinstance(value, dict):
            return {str(k): _entry_text(v) for k, v in value.items()}
        return {_WHOLE: _entry_text(value)}

    def reset(self):
        self.db = self.db_cls.model_validate_json(self.raw)
        self.reads = {}
        for field in type(self.db).model_fields:
            value = getattr(self.db, field)
            if isinstance(value, dict):
                table = _Reads(value)
                table.reads = self.reads.setdefault(field, set())
                self.db.__dict__[field] = table
        self.kit = self.kit_cls(self.db)
        self._tools = {name: self.as_tool(fn) for name, fn in self.kit.tools.items()}

    def tools(self):
        out = []
        for name, tool in self._tools.items():
            schema = tool.openai_schema["function"]
            params = schema["parameters"]
            params = _inline_refs(params, params.get("$defs", {}))
            params.pop("title", None)
            for prop in (params.get("properties") or {}).values():
                if isinstance(prop, dict):
                    prop.pop("title", None)
            out.append({"name": name, "description": schema["description"],
                        "parameters": params, "kind": self.kit.tool_type(name).value})
        return out

    def call(self, name, arguments):
        if not self.kit.has_tool(name):
            raise ValueError(f"Tool '{name}' not found.")
        if not isinstance(arguments, dict):
            raise ValueError("arguments must be an object")
        # arguments through the tool's pydantic parameter model, as a typed signature expects
        # (a `payment: Payment` parameter gets a Payment, not a dict); fields not given keep
        # the function's defaults
        params = self._tools[name].params.model_validate(arguments)
        result = self.kit.use_tool(name, **{k: getattr(params, k) for k in params.model_fields_set})
        text = self.to_json_str(result)
        return text if isinstance(text, str) else json.dumps(text, default=str)

    def state(self):
        dump = self.db.model_dump()
        changed, touched, parts = {}, set(), []
        for table, value in sorted(dump.items()):
            now, base = self._entries(value), self.base_entries.get(table, {})
            text = now[_WHOLE] if _WHOLE in now else "{" + ", ".join(
                f"{json.dumps(k)}: {now[k]}" for k in sorted(now)) + "}"
            parts.append(f"{json.dumps(table)}: {text}")
            diff = {k for k in now.keys() | base.keys() if now.get(k) != base.get(k)}
            if diff:
                rows = value if isinstance(value, dict) else {_WHOLE: value}
                changed[table] = {k: (json.loads(_entry_text(rows[k])) if k in now else None)
                                  for k in sorted(diff)}
            touched |= {(table, k) for k in diff}
        for table, keys in self.reads.items():
            touched |= {(table, str(k)) for k in keys}
        # the text json.dumps(dump, sort_keys=True) would give, assembled from the entries'
        digest = hashlib.sha256(("{" + ", ".join(parts) + "}").encode()).hexdigest()
        return {"hash": digest, "changed": changed, "touched": sorted(touched)}


def _serve(request, domain):
    op = request.get("op")
    if op == "call":
        pid, reads = os.getpid(), {t: set(keys) for t, keys in domain.reads.items()}
        try:
            return {"ok": True, "result": domain.call(request.get("name"),
                                                      request.get("arguments"))}
        except BaseException as e:  # tau2-bench: a raising tool is an "Error: ..." observation
            for table, keys in reads.items():  # a failed call looked nothing up
                domain.reads[table].intersection_update(keys)
            return {"ok": False, "error": f"Error: {e or type(e).__name__}"}
        finally:
            if os.getpid() != pid:  # a forked copy of the worker must not answer too
                os._exit(0)
    if op == "reset":
        domain.reset()
        return {"ok": True}
    if op == "state":
        return {"ok": True, **domain.state()}
    if op == "replay":
        domain.reset()
        outcomes = []
        for action in request.get("actions") or []:
            reply = _serve({"op": "call", **action}, domain)
            outcomes.append({"ok": reply["ok"],
                             "observation": reply.get("result", reply.get("error"))})
        return {"ok": True, "outcomes": outcomes, **domain.state()}
    return {"ok": False, "error": f"unknown op {op!r}; allowed: call, reset, state, replay"}


def main():
    # the protocol owns fd 1; anything the domain prints goes to stderr
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(obj):
        out.write(json.dumps(obj, default=str) + "\n")
        out.flush()

    domain = None
    for line in sys.stdin:
        try:
            request = json.loads(line)
            if domain is None:
                if request.get("op") != "load":
                    raise ValueError("the first request must be op 'load'")
                sys.path[:0] = list(request.get("site") or [])
                from loguru import logger

                logger.remove()  # tau2 and the domains log per call; the host never reads it
                domain = Domain(request["folder"], request["name"])
                reply = {"ok": True, "tools": domain.tools()}
            else:
                reply = _serve(request, domain)
        except Exception as e:
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        send(reply)


if __name__ == "__main__":
    main()
