"""Token encode/decode for rollouts, through the Rust tokenizer behind a transformers fast tokenizer.

Episodes tokenise many short continuation blocks (`\\n<|im_start|>user\\n<tool_response>\\n…`) whose
template scraps repeat on every turn. The tokenizer itself splits its input at added tokens
(`<|im_start|>`, `<tool_response>`, …) and tokenises the pieces between them independently, so we
do that split ourselves, look the short repeated pieces up in a cache and send only the new text
(observations, user replies) to the tokenizer. The ids are exactly the tokenizer's: the split is only used
for tokenizers whose added tokens split plainly (no lstrip/rstrip/single-word rules, matched
before normalisation), and a self-check against the plain path at construction falls back to it
on any disagreement.
"""

from __future__ import annotations

import logging
import re
from typing import Sequence

from orchestrax.agent import chat

log = logging.getLogger(__name__)

_SELF_CHECK = (
    "\n<|im_start|>user\n<tool_response>\nsearch: 3 hits\n</tool_response>\n<tool_response>\n"
    "  {\"a\": [1, 2]}  \n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi  there\n\n<|im_end|>",
    " <tool_call>x</tool_call>\t\n<|im_end|><|im_end|>é ü 中文 \n\n",
    "<<|im_start|>><</think>>",
)


class Codec:
    """Fast encode/decode for a transformers fast tokenizer (or a bare `tokenizers.Tokenizer`).
    Special tokens in text are recognised; decode keeps them."""

    def __init__(self, tokenizer):
        self._tok = getattr(tokenizer, "backend_tokenizer", tokenizer)
        vocab = self._tok.get_vocab(with_added_tokens=True)
        missing = [t for t in ("<|im_start|>", "<|im_end|>") if t not in vocab]
        if missing:
            raise ValueError(f"tokenizer lacks Qwen3 special tokens {missing}; the chat format "
                             "needs <|im_start|> and <|im_end|>")
        self.im_end = vocab["<|im_end|>"]
        self.stop_ids = tuple(vocab[t] for t in ("<|im_end|>", "<|endoftext|>") if t in vocab)

        self._prompts: dict[str, list[int]] = {}
        self._pieces: dict[str, tuple[int, ...]] = {}
        self._added = self._added_token_ids(vocab)
        self._split = None
        if self._added:  # longest first, so the regex takes the longest match at a position
            alternatives = sorted(self._added, key=len, reverse=True)
            self._split = re.compile("(" + "|".join(map(re.escape, alternatives)) + ")")
            self._pieces = {p: tuple(self._encode_plain(p)) for p in self._template_pieces()}
            if any(self._encode_split(t) != self._encode_plain(t) for t in _SELF_CHECK):
                log.warning("tokenizer splits added tokens differently; using plain encode")
                self._split = None

    def _added_token_ids(self, vocab: dict[str, int]) -> dict[str, int]:
        """Added tokens that split text plainly, or {} when any of them has a rule that makes
        the split depend on its neighbours (then encode always goes through the tokenizer)."""
        decoder = self._tok.get_added_tokens_decoder()
        out = {}
        for token in decoder.values():
            if token.lstrip or token.rstrip or token.single_word or (
                    token.normalized and self._tok.normalizer is not None):
                return {}
            out[token.content] = vocab[token.content]
        return out

    def _template_pieces(self) -> set[str]:
        """The text between added tokens in the chat format's own scaffolding ("user\n",
        "assistant\n", "\n", ...): only these are cached, so content is always tokenised."""
        marker = "\x00"
        rendered = (chat.tool_response_delta([marker, marker]), chat.user_delta(marker),
                    chat.tool_response_delta([marker], enable_thinking=False),
                    chat.render_messages([{"role": "system", "content": marker},
                                          {"role": "user", "content": marker}],
                                         add_generation_prompt=True))
        return {p for text in rendered for i, p in enumerate(self._split.split(text))
                if not i % 2 and p and marker not in p}

    def _encode_plain(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def _encode_piece(self, piece: str) -> Sequence[int]:
        ids = self._pieces.get(piece)
        return ids if ids is not None else self._encode_plain(piece)

    def _encode_split(self, text: str) -> list[int]:
        out: list[int] = []
        # re.split with one group alternates text, token, text, ...; odd indices are tokens.
        for i, part in enumerate(self._split.split(text)):
            if i % 2:
                out.append(self._added[part])
            elif part:
                out.extend(self._encode_piece(part))
        return out

    def encode(self, text: str) -> list[int]:
        return self._encode_split(text) if self._split is not None else self._encode_plain(text)

    def encode_prompt(self, text: str) -> list[int]:
        """`encode` with a small cache: a GRPO group shares one prompt across its rollouts."""
        ids = self._prompts.get(text)
        if ids is None:
            if len(self._prompts) >= 256:
                self._prompts.pop(next(iter(self._prompts)))
            ids = self._prompts[text] = self.encode(text)
        return list(ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)
