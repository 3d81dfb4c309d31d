"""Token encode/decode for rollouts, through a `tokenizers.Tokenizer` (or the one behind a
transformers fast tokenizer).

Episodes tokenise many short continuation blocks (`\\n<|im_start|>user\\n<tool_response>\\n…`) whose
template scraps repeat on every turn. The tokenizer itself splits its input at added tokens
(`<|im_start|>`, `<tool_response>`, …) and tokenises the pieces between them independently, so we
do that split ourselves, look the short repeated pieces up in a cache and send only the new text
(observations, user replies) to the tokenizer. The ids are exactly the tokenizer's: the split is only used
for tokenizers whose added tokens split plainly (no lstrip/rstrip/single-word rules, matched
before normalisation), and a self-check against the plain path at construction falls back to it
on any disagreement.

Content is never structure: `encode_parts` tokenises the text of tool observations and user
replies with the tokenizer's model alone wherever that text spells an added token, so a tool
that prints `<|im_end|>` or `</tool_response>` shows the policy those characters, not the token
that would end its turn or the block. Content without such text gets the tokenizer's own ids.
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


def _encodable(text: str) -> str:
    """`text` with lone surrogates (JSON allows "\\ud800"; the tokenizer refuses them) as "?"."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


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

        self._prompts: dict[str | tuple[str, ...], list[int]] = {}
        self._pieces: dict[str, tuple[int, ...]] = {}
        every_added = [t.content for t in self._tok.get_added_tokens_decoder().values()]
        # Longest first, so the regex takes the longest match at a position.
        self._any_added = re.compile("|".join(
            map(re.escape, sorted(every_added, key=len, reverse=True)))) if every_added else None
        self._added = self._added_token_ids(vocab)
        self._split = None
        if self._added:
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

    def encode_parts(self, parts: Sequence[str]) -> list[int]:
        """Ids of `"".join(parts)` where the odd-indexed parts are content (see the module
        docstring): added tokens are recognised only in the even-indexed scaffolding, and a lone
        surrogate in content becomes "?". Equals `encode("".join(parts))` whenever no content
        spells an added token."""
        parts = [p if k % 2 == 0 else _encodable(p) for k, p in enumerate(parts)]
        contents = parts[1::2]
        if self._any_added is None or not any(map(self._any_added.search, contents)):
            return self.encode("".join(parts))
        if self._split is None:  # tokens with neighbour rules: encode each part on its own
            return [i for k, part in enumerate(parts) for i in (
                self._encode_model(part) if k % 2 else self._encode_plain(part))]
        out: list[int] = []
        run: list[str] = []  # the text since the last structural added token

        def flush():
            text = "".join(run)
            run.clear()
            if text:
                out.extend(self._encode_model(text) if self._any_added.search(text)
                           else self._encode_piece(text))

        for k, part in enumerate(parts):
            if k % 2:
                run.append(part)
                continue
            for i, piece in enumerate(self._split.split(part)):
                if i % 2:
                    flush()
                    out.append(self._added[piece])
                else:
                    run.append(piece)
        flush()
        return out

    def _encode_model(self, text: str) -> list[int]:
        """`text` through normaliser, pre-tokenizer and model only: what the tokenizer would
        give if it had no added tokens. Slower (a Python loop over pre-tokens); used only for
        content that spells an added token."""
        if self._tok.normalizer is not None:
            text = self._tok.normalizer.normalize_str(text)
        words = ([w for w, _ in self._tok.pre_tokenizer.pre_tokenize_str(text)]
                 if self._tok.pre_tokenizer is not None else [text])
        return [t.id for w in words for t in self._tok.model.tokenize(w)]

    def encode_prompt(self, parts: str | Sequence[str]) -> list[int]:
        """`encode` (a string) or `encode_parts` (`chat.prompt_parts`) with a small cache: a GRPO
        group shares one prompt across its rollouts."""
        key = parts if isinstance(parts, str) else tuple(parts)
        ids = self._prompts.get(key)
        if ids is None:
            if len(self._prompts) >= 256:
                self._prompts.pop(next(iter(self._prompts)))
            ids = self._prompts[key] = (self.encode(parts) if isinstance(parts, str)
                                        else self.encode_parts(parts))
        return list(ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)
