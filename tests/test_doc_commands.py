"""Every command line in README.md and BUILD.md code blocks is checked against the real code:
`orchestrax ...` lines are parsed by the real CLI parser (not run: they name GPU servers and
full-size runs); `python tools/...`, `python bench/...` and `python -m` lines name a file or
module that exists, and every `--flag` they pass appears in that file's argument parser."""

import importlib.util
import pathlib
import re
import shlex

import pytest

from orchestrax.cli import build_parser

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _commands() -> list[tuple[str, str]]:
    out = []
    for doc in ("README.md", "BUILD.md"):
        for block in re.findall(r"```[^\n]*\n(.*?)```", (ROOT / doc).read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                for seg in line.split(";"):
                    # usage notation: [optional parts] dropped, "..." (more of the same) a value
                    seg = re.sub(r"\[[^\]]*\]", " ", seg)
                    seg = re.sub(r"(?<!\S)\.\.\.(?!\S)", "MORE", seg)
                    plain = [w for w in seg.split() if not re.fullmatch(r"[A-Z_]+=\S*", w)]
                    if not plain or plain[0] not in ("orchestrax", "python"):
                        continue  # printed output, not a command (it may hold a lone quote)
                    words = shlex.split(seg, comments=True)
                    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # env assignments
                        words = words[1:]
                    if words and words[0] in ("orchestrax", "python"):
                        out.append((doc, shlex.join(words)))
    return out


COMMANDS = _commands()


def test_the_docs_have_commands():
    assert sum(c.startswith("orchestrax eval") for _, c in COMMANDS) >= 4
    assert any(c.startswith("orchestrax export") for _, c in COMMANDS)
    assert any(c.startswith("orchestrax index") for _, c in COMMANDS)


@pytest.mark.parametrize("doc,command", [c for c in COMMANDS if c[1].startswith("orchestrax")])
def test_orchestrax_lines_parse_with_the_real_cli(doc, command, capsys):
    try:
        build_parser().parse_args(shlex.split(command)[1:])
    except SystemExit:
        pytest.fail(f"{doc}: `{command}` is refused: {capsys.readouterr().err.strip()}")


@pytest.mark.parametrize("doc,command", [c for c in COMMANDS if c[1].startswith("python")])
def test_python_lines_name_real_files_and_flags(doc, command):
    words = shlex.split(command)[1:]
    if words[0] == "-m":
        spec = importlib.util.find_spec(words[1])
        assert spec is not None and spec.origin, f"{doc}: no module {words[1]}"
        source, flags = pathlib.Path(spec.origin).read_text(), words[2:]
    else:
        path = ROOT / words[0]
        assert path.is_file(), f"{doc}: {words[0]} does not exist"
        source, flags = path.read_text(), words[1:]
    for flag in (w.split("=")[0] for w in flags if w.startswith("--")):
        assert f'"{flag}"' in source, f"{doc}: `{command}`: {flag} is not an argument there"
