"""Prompts of an exact token count, in the server's own tokenizer, starting with fresh random text.

The text is random common words. With a `/tokenize` endpoint the bench keeps the words
the server counts as one token each and checks every prompt before sending it (trimming
or padding the tail until it is exact); without one it calibrates tokens per word from
`usage.prompt_tokens` and reports how close it came.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence

from swaplab.bench.words import WORDS

# A prompt whose length is still off after this many corrections is sent as it is
# (the achieved-length check then flags its level).
FIT_ROUNDS = 6
# How many tokenize calls run at once while prompts are prepared.
TOKENIZE_CONCURRENCY = 4

Tokenize = Callable[[str], Awaitable[list[int]]]


def random_words(rng: random.Random, words: Sequence[str], count: int) -> list[str]:
    return [rng.choice(words) for _ in range(count)]


async def single_token_words(tokenize: Tokenize, words: Sequence[str] = WORDS) -> tuple[str, ...]:
    """The words the tokenizer counts as exactly one token after a space, in a handful of calls.

    A group whose joined text tokenizes to one token per word is kept whole; any other
    is split in halves until the odd words are found (most tokenizers keep all of them).
    """
    kept: list[str] = []

    async def sift(group: Sequence[str]) -> None:
        count = len(await tokenize(" " + " ".join(group)))
        if count == len(group):
            kept.extend(group)
        elif len(group) > 1:
            middle = len(group) // 2
            await sift(group[:middle])
            await sift(group[middle:])

    await sift(list(words))
    return tuple(word for word in words if word in set(kept))


class PromptMaker:
    """Builds prompt texts whose content has a given number of tokens.

    `exact` (a tokenizer is at hand): every word is one token and `fit` checks each text
    with the tokenizer. Otherwise `words_per_token` comes from calibration and the
    count is an estimate.
    """

    def __init__(self, words: Sequence[str], *, tokenize: Tokenize | None, tokens_per_word: float = 1.0):
        if not words:
            raise ValueError("no words to build prompts from")
        self.words = tuple(words)
        self.tokenize = tokenize
        self.tokens_per_word = tokens_per_word

    @property
    def exact(self) -> bool:
        return self.tokenize is not None

    def draft(self, rng: random.Random, tokens: int, prefix: Sequence[str] = ()) -> list[str]:
        """Words for `tokens` content tokens (the prefix's words included), fresh random after the prefix."""
        wanted_words = max(len(prefix), round(tokens / self.tokens_per_word))
        return [*prefix, *random_words(rng, self.words, wanted_words - len(prefix))]

    async def fit(self, rng: random.Random, tokens: int, prefix: Sequence[str] = ()) -> list[str]:
        """Words whose text is exactly `tokens` tokens by the server's count (closest found otherwise)."""
        words = self.draft(rng, tokens, prefix)
        if self.tokenize is None:
            return words
        for _ in range(FIT_ROUNDS):
            count = len(await self.tokenize(" ".join(words)))
            if count == tokens:
                break
            if count > tokens:
                surplus = min(count - tokens, len(words) - len(prefix))
                if surplus == 0:
                    break  # the prefix alone is too long: nothing of ours left to trim
                del words[len(words) - surplus :]
            else:
                words += random_words(rng, self.words, tokens - count)
        return words

    async def fit_many(self, rng: random.Random, lengths: Sequence[int], prefix: Sequence[str] = ()) -> list[str]:
        """Texts for each of `lengths`, each starting with `prefix` and then fresh random words."""
        if self.tokenize is None:
            return [" ".join(self.draft(rng, tokens, prefix)) for tokens in lengths]
        # Each fit draws from its own generator, seeded here in order, so results don't
        # depend on which tokenize call returns first.
        seeds = [rng.getrandbits(64) for _ in lengths]
        gate = asyncio.Semaphore(TOKENIZE_CONCURRENCY)

        async def one(tokens: int, seed: int) -> str:
            async with gate:
                return " ".join(await self.fit(random.Random(seed), tokens, prefix))

        return list(await asyncio.gather(*(one(tokens, seed) for tokens, seed in zip(lengths, seeds))))
