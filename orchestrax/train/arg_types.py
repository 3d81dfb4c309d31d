"""argparse types shared by the commands: a bad flag is refused in one line that names it."""

from __future__ import annotations

import argparse
import pathlib


def at_least(low: int):
    """argparse type: an int >= low, refused in one line naming the flag."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value}; must be >= {low}")
        return value
    return parse


def tokenizer_dir(text: str) -> str:
    """argparse type: 'tiny' or a directory holding a saved Hugging Face tokenizer."""
    path = pathlib.Path(text)
    if text != "tiny" and path.is_dir() and not any(
            (path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        raise argparse.ArgumentTypeError(f"{text}: no tokenizer.json or tokenizer_config.json in "
                                         "that directory; give 'tiny' or a directory a Hugging "
                                         "Face tokenizer was saved to")
    if text != "tiny" and not path.exists() and (path.is_absolute() or text.startswith(".")):
        raise argparse.ArgumentTypeError(f"{text}: no such directory")
    return text
