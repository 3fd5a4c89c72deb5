"""Adapter from the worker's loaded tokenizer to :class:`ParserTokenizer`."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

from schemas.bounds import MAX_TOKEN_ID
from worker.core.model_dir import LoadedTokenizer
from worker.errors import TokenIdRangeError


def check_token_id_range(ids: Sequence[int]) -> None:
    """Raise :class:`TokenIdRangeError` (a 400) for the first id the tokenizer cannot take."""
    if ids and (min(ids) < 0 or max(ids) > MAX_TOKEN_ID):
        raise TokenIdRangeError(next(i for i in ids if not 0 <= i <= MAX_TOKEN_ID))


class TokenizerAdapter:
    """Satisfies :class:`worker.core.parsing.types.ParserTokenizer` over ``tokenizers``."""

    def __init__(self, loaded: LoadedTokenizer) -> None:
        self._loaded = loaded
        self.model_type: str | None = loaded.model_type
        self.special_ids: frozenset[int] = loaded.special_ids

    @cached_property
    def _vocab(self) -> dict[str, int]:
        return dict(self._loaded.backend.get_vocab(with_added_tokens=True))

    def token_to_id(self, token: str) -> int | None:
        return self._vocab.get(token)

    def id_to_token(self, token_id: int) -> str | None:
        if not 0 <= token_id <= MAX_TOKEN_ID:
            return None  # no token has it; the backend would raise OverflowError
        token: str | None = self._loaded.backend.id_to_token(token_id)
        return token

    def get_vocab(self) -> dict[str, int]:
        return self._vocab

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """Raises :class:`worker.errors.TokenIdRangeError` (a 400) where the backend would raise."""
        check_token_id_range(ids)
        text: str = self._loaded.backend.decode(ids, skip_special_tokens=skip_special_tokens)
        return text


def adapter_for(loaded: LoadedTokenizer) -> TokenizerAdapter:
    """Wrap a :class:`LoadedTokenizer` for the parsers."""
    return TokenizerAdapter(loaded)
