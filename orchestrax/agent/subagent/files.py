"""The File Inspector's tool: reads a task's attached files (plain text, CSV, PDF) as text.

Only the files attached to the task can be read (by their base name or full path), so a policy
cannot walk the host's filesystem. PDFs are read with pypdf, page by page.
"""

from __future__ import annotations

import csv
import io
import pathlib
import time
from typing import Any, Sequence

from orchestrax.tools.tool import ToolError, ToolResult, ToolSpec

TEXT_SUFFIXES = (".txt", ".md", ".json", ".jsonl", ".py", ".log", ".xml", ".html")
TABLE_SUFFIXES = (".csv", ".tsv")
SUFFIXES = TEXT_SUFFIXES + TABLE_SUFFIXES + (".pdf",)


def read_text(path: pathlib.Path) -> str:
    return path.read_text(errors="replace")


def read_table(path: pathlib.Path, max_rows: int) -> str:
    """Header, row count and the first `max_rows` rows, one per line, cells joined by ' | '."""
    dialect = "excel-tab" if path.suffix.lower() == ".tsv" else "excel"
    rows = list(csv.reader(io.StringIO(path.read_text(errors="replace")), dialect=dialect))
    if not rows:
        return "(empty table)"
    header, body = rows[0], rows[1:]
    lines = [f"columns ({len(header)}): " + " | ".join(header), f"rows: {len(body)}"]
    lines += [" | ".join(r) for r in body[:max_rows]]
    if len(body) > max_rows:
        lines.append(f"... {len(body) - max_rows} more rows")
    return "\n".join(lines)


def read_pdf(path: pathlib.Path) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(str(path))
        pages = [page.extract_text() or "" for page in reader.pages]
    except (PdfReadError, ValueError, KeyError) as e:
        raise ToolError(f"cannot read PDF {path.name}: {e}") from None
    return "\n".join(f"[page {i}]\n{text.strip()}" for i, text in enumerate(pages, 1))


class FileReadTool:
    """`await tool({"path": name})` -> the file's text (cut at `max_chars`)."""

    def __init__(self, attachments: Sequence[str | pathlib.Path], *, max_chars: int = 8000,
                 max_rows: int = 50, name: str = "read_file"):
        if max_chars < 1 or max_rows < 1:
            raise ValueError(f"FileReadTool max_chars={max_chars}, max_rows={max_rows}; "
                             "both must be >= 1")
        self.files = {pathlib.Path(p).name: pathlib.Path(p) for p in attachments}
        self.max_chars, self.max_rows = max_chars, max_rows
        self.spec = ToolSpec(
            name=name,
            description=("Read one attached file (plain text, CSV/TSV or PDF) and return its "
                         "text. Attached: " + (", ".join(sorted(self.files)) or "(none)") + "."),
            parameters={"type": "object", "required": ["path"],
                        "properties": {"path": {"type": "string",
                                                "description": "file name of the attachment"}}},
            category="basic", latency_s=0.01)

    def _resolve(self, name: Any) -> pathlib.Path:
        if not isinstance(name, str) or not name:
            raise ToolError(f"path={name!r}; give the name of an attached file")
        path = self.files.get(pathlib.Path(name).name)
        if path is None:
            raise ToolError(f"path={name!r} is not attached; attached: "
                            f"{', '.join(sorted(self.files)) or '(none)'}")
        if path.suffix.lower() not in SUFFIXES:
            raise ToolError(f"{path.name}: type {path.suffix or '(none)'} is not readable; "
                            f"allowed: {', '.join(SUFFIXES)}")
        if not path.is_file():
            raise ToolError(f"{path.name}: the attachment is missing on disk")
        return path

    async def __call__(self, arguments: dict[str, Any]) -> ToolResult:
        path = self._resolve(arguments.get("path"))
        t0 = time.monotonic()
        suffix = path.suffix.lower()
        text = (read_pdf(path) if suffix == ".pdf"
                else read_table(path, self.max_rows) if suffix in TABLE_SUFFIXES
                else read_text(path))
        if len(text) > self.max_chars:
            text = text[:self.max_chars] + f"\n... [{len(text) - self.max_chars} more characters]"
        return ToolResult(observation=text, latency=time.monotonic() - t0)
