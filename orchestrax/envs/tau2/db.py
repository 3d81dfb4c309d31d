"""Copy-on-write view of a domain database, with a log of which entries were touched.

A domain DB is `{table: {key: entry}}` (retail: products/users/orders; airline:
flights/users/reservations). An episode gets a `DomainDB` over the loaded base: tables are
shallow copies, and an entry is deep-copied the first time a tool mutates it, so a fresh
episode costs microseconds instead of a 70 ms deepcopy of the whole file.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any


class Rejected(ValueError):
    """The domain refuses an action (bad id, wrong status, ...). Raised before any mutation,
    so a rejected action leaves the DB as it was."""


class DomainDB:
    def __init__(self, base: dict[str, dict[str, Any]]):
        self._base = base
        self.tables: dict[str, dict[str, Any]] = {t: dict(rows) for t, rows in base.items()}
        self._owned: set[tuple[str, str]] = set()
        self.touched: set[tuple[str, str]] = set()

    def get(self, table: str, key: str, what: str) -> Any:
        """Read an entry (callers must not mutate it); `Rejected` naming `what` if absent."""
        rows = self.tables[table]
        if not isinstance(key, str) or key not in rows:
            raise Rejected(f"{what} {key} not found")
        self.touched.add((table, key))
        return rows[key]

    def has(self, table: str, key: str) -> bool:
        return key in self.tables[table]

    def mut(self, table: str, key: str, what: str) -> Any:
        """The entry, owned by this DB and safe to mutate."""
        entry = self.get(table, key, what)
        if (table, key) not in self._owned:
            entry = copy.deepcopy(entry)
            self.tables[table][key] = entry
            self._owned.add((table, key))
        return entry

    def insert(self, table: str, key: str, entry: Any) -> None:
        self.tables[table][key] = entry
        self._owned.add((table, key))
        self.touched.add((table, key))

    def mark(self, table: str, key: str) -> None:
        """Record a read made by scanning (e.g. finding a user by email)."""
        self.touched.add((table, key))

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """An independent JSON-able deep copy of the current state."""
        return json.loads(json.dumps(self.tables))

    def hash(self) -> str:
        return db_hash(self.tables)

    def same_state(self, other: "DomainDB") -> bool:
        """`self.hash() == other.hash()` for two views of the same base, in microseconds:
        entries neither side has written are the base's own objects, so only written ones
        are compared (as canonical JSON, so 1 and 1.0 differ exactly as in the hash)."""
        if other._base is not self._base:
            raise ValueError("same_state compares DomainDBs over the same base DB only")
        for table, key in self._owned | other._owned:
            mine, theirs = self.tables[table].get(key, _ABSENT), other.tables[table].get(key, _ABSENT)
            if mine is _ABSENT or theirs is _ABSENT:
                if mine is not theirs:
                    return False
            elif json.dumps(mine, sort_keys=True) != json.dumps(theirs, sort_keys=True):
                return False
        return True


_ABSENT = object()


def db_hash(db: dict[str, Any]) -> str:
    """sha256 of `json.dumps(db, sort_keys=True)`, the benchmark's DB comparison."""
    return hashlib.sha256(json.dumps(db, sort_keys=True, default=str).encode()).hexdigest()


def safe_calculate(expression: str) -> str:
    """Arithmetic on + - * / ( ) and decimals, rounded to 2 places (the domains' `calculate`)."""
    import ast
    import operator

    if not isinstance(expression, str) or not all(c in "0123456789+-*/(). " for c in expression):
        raise Rejected("Invalid characters in expression")
    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.Pow: operator.pow}

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise Rejected("Exponent too large")
            return ops[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        raise Rejected("Invalid expression")

    try:
        return str(round(float(ev(ast.parse(expression, mode="eval"))), 2))
    except (SyntaxError, ZeroDivisionError, OverflowError) as e:
        raise Rejected(f"Invalid expression: {e}") from None
