"""The File Inspector's tool reads a PDF, a CSV and a text file that the test writes; and the
File Inspector sub-agent hands the PDF's content back through a scripted model."""

import asyncio

import pytest
from pypdf import PdfWriter
from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

from orchestrax.agent.codec import Codec
from orchestrax.agent.subagent import ROLES, FileReadTool, SubAgent
from orchestrax.agent.scripted import ScriptedSampler, tiny_qwen3_tokenizer
from orchestrax.tools.tool import ToolError


def write_pdf(path, pages):
    """A real PDF with one Helvetica text line per page."""
    writer = PdfWriter()
    for line in pages:
        page = writer.add_blank_page(612, 792)
        font = DictionaryObject({NameObject("/Type"): NameObject("/Font"),
                                 NameObject("/Subtype"): NameObject("/Type1"),
                                 NameObject("/BaseFont"): NameObject("/Helvetica")})
        page[NameObject("/Resources")] = DictionaryObject({NameObject("/Font"): DictionaryObject(
            {NameObject("/F1"): writer._add_object(font)})})
        content = DecodedStreamObject()
        content.set_data(f"BT /F1 12 Tf 72 720 Td ({line}) Tj ET".encode())
        page[NameObject("/Contents")] = writer._add_object(content)
    writer.write(str(path))


@pytest.fixture()
def files(tmp_path):
    write_pdf(tmp_path / "report.pdf", ["Iron melts at 1538 C", "Copper melts at 1085 C"])
    (tmp_path / "data.csv").write_text("city,population\nParis,2100000\nLyon,520000\n")
    (tmp_path / "notes.txt").write_text("The meeting is on Tuesday.\n")
    (tmp_path / "image.png").write_bytes(b"\x89PNG")
    return tmp_path


def read(tool, path):
    return asyncio.run(tool({"path": path})).observation


def test_reads_pdf_csv_and_text(files):
    tool = FileReadTool([files / n for n in ("report.pdf", "data.csv", "notes.txt", "image.png")])
    assert read(tool, "report.pdf") == ("[page 1]\nIron melts at 1538 C\n"
                                        "[page 2]\nCopper melts at 1085 C")
    assert read(tool, "data.csv") == ("columns (2): city | population\nrows: 2\n"
                                      "Paris | 2100000\nLyon | 520000")
    assert read(tool, str(files / "notes.txt")) == "The meeting is on Tuesday.\n"
    assert "report.pdf" in tool.spec.description


def test_long_tables_and_texts_are_cut(files):
    (files / "big.csv").write_text("a\n" + "".join(f"{i}\n" for i in range(10)))
    tool = FileReadTool([files / "big.csv", files / "notes.txt"], max_rows=3, max_chars=8)
    assert read(tool, "big.csv") == "columns \n... [37 more characters]"
    assert read(tool, "notes.txt") == "The meet\n... [19 more characters]"
    assert read(FileReadTool([files / "big.csv"], max_rows=3), "big.csv") == (
        "columns (1): a\nrows: 10\n0\n1\n2\n... 7 more rows")


def test_only_attached_readable_files(files):
    tool = FileReadTool([files / "notes.txt", files / "image.png", files / "gone.txt"])
    with pytest.raises(ToolError, match=r"path='/etc/passwd' is not attached; attached: "):
        read(tool, "/etc/passwd")
    with pytest.raises(ToolError, match=r"image.png: type .png is not readable; allowed: .txt"):
        read(tool, "image.png")
    with pytest.raises(ToolError, match="gone.txt: the attachment is missing"):
        read(tool, "gone.txt")
    with pytest.raises(ToolError, match="path=3; give the name"):
        read(tool, 3)
    (files / "broken.pdf").write_bytes(b"%PDF-1.4 not really")
    with pytest.raises(ToolError, match="cannot read PDF broken.pdf"):
        read(FileReadTool([files / "broken.pdf"]), "broken.pdf")


def test_file_inspector_subagent_reads_the_pdf(files):
    tok = tiny_qwen3_tokenizer(512)

    def script(n, ids):
        prompt = tok.decode(list(ids))
        if "<tool_response>" not in prompt:
            return ('<tool_call>\n{"name": "read_file", "arguments": {"path": "report.pdf"}}\n'
                    '</tool_call>')
        assert "Copper melts at 1085 C" in prompt   # the PDF text reached the sub-agent
        return "<answer>Copper: 1085 C</answer>"

    agent = SubAgent(ROLES["file_inspector"], ScriptedSampler(tok, script=script), Codec(tok),
                     [FileReadTool([files / "report.pdf"])])
    report = asyncio.run(agent.run("Melting point of copper in report.pdf?", rid="t"))
    assert report.ok and report.result == "Copper: 1085 C"
    assert [c.name for c in report.trajectory.tool_calls] == ["read_file"]
    with pytest.raises(ValueError, match=r"cannot hold tools \['read_file'\]"):
        SubAgent(ROLES["coder"], None, Codec(tok), [FileReadTool([])])
