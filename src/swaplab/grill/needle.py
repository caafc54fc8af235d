"""The needle suite: one fact hidden at a depth of a haystack of filler text, asked for at the end.

Per cell (depth x length): the filler is plain sentences drawn from a seeded generator
(the same for every cell of a seed, so depth is the only thing that moves); the fact is
"The access code for the <name> vault is <word>-<4 digits>.", unique per cell; the
prompt is an instruction, the haystack with the fact at `depth` of it (by characters,
at a sentence boundary), and the question. The whole user message is sized to the
cell's length in the server's own tokens (`/tokenize`); a server without one gets the
bench's calibration (tokens per word from `usage.prompt_tokens`), and the request's
measured `prompt_tokens` is recorded either way.

Scoring is a deterministic match of the code in the final answer (thinking removed by
`split_answer`): found = pass, not found = fail, the budget ran out inside the thinking
= inconclusive (not wrong: the model never answered).
"""

from __future__ import annotations

import random
import re
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from time import perf_counter

from swaplab.client import OpenAIClient, TokenizeUnavailableError
from swaplab.grill.extract import split_answer
from swaplab.grill.outcome import ERROR, FAIL, INCONCLUSIVE, PASS, Sampling, TaskOutcome

# Corrections of the sentence count before the haystack is taken as it is.
FIT_ROUNDS = 6
# A first guess of filler tokens per sentence, refined by measuring.
TOKENS_PER_SENTENCE_GUESS = 14

VAULTS = (
    "amber", "basalt", "cedar", "cobalt", "coral", "crimson", "falcon", "garnet", "granite", "harbor",
    "indigo", "ivory", "jasper", "juniper", "lantern", "maple", "marble", "meadow", "onyx", "orchid",
    "pepper", "quartz", "raven", "saffron", "silver", "spruce", "thistle", "topaz", "willow", "zephyr",
)
CODE_WORDS = (
    "acorn", "badger", "beacon", "bramble", "canyon", "comet", "dune", "ember", "fjord", "glacier",
    "hazel", "heron", "kestrel", "lagoon", "lotus", "mango", "nectar", "otter", "pebble", "prism",
    "quill", "reef", "sable", "tundra", "umber", "velvet", "walnut", "yarrow",
)

# Filler: ordinary sentences about nothing in particular; none mentions vaults or codes.
_SUBJECTS = (
    "The old fisherman", "A young teacher", "The city council", "Our neighbour", "The baker on the corner",
    "A travelling musician", "The river pilot", "My grandmother", "The night watchman", "A group of students",
    "The station master", "The village doctor", "A tired cyclist", "The museum guide", "The gardener",
)
_VERBS = (
    "walked along", "painted", "talked about", "looked at", "remembered", "cleaned", "visited",
    "wrote a letter about", "sang a song about", "took a photograph of", "argued about", "repaired",
)
_OBJECTS = (
    "the narrow bridge", "the harbour wall", "an empty market", "the orchard", "the lighthouse",
    "a broken clock", "the library steps", "the quiet square", "a blue boat", "the railway station",
    "the wheat fields", "an old bicycle", "the chapel roof", "the stone well", "the hill above the town",
)
_TIMES = (
    "early in the morning", "after the rain stopped", "on a windy afternoon", "before supper",
    "late in the autumn", "during the long summer", "at the end of the week", "when the bells rang",
)
_AFTERTHOUGHTS = (
    "Nobody thought much of it at the time.",
    "The weather stayed mild for the rest of the day.",
    "Later that evening the streets were quiet again.",
    "It was the kind of thing people forget quickly.",
    "Some of the neighbours still talk about it.",
    "The shops closed a little earlier than usual.",
    "A dog barked somewhere in the distance.",
    "The smell of fresh bread drifted down the lane.",
)

INSTRUCTION = (
    "Below is a long text. Somewhere in it is one sentence giving an access code. "
    "Read the text, then answer the question that follows it."
)

Count = Callable[[str], Awaitable[int]]


@dataclass(frozen=True)
class NeedleCell:
    """One cell of the grid: where the fact goes, how long the prompt is, and what must come back."""

    depth: float  # 0 = the start of the haystack, 1 = its end
    context_tokens: int  # the prompt's length in the server's tokens (the user message)
    fact: str  # the unique answer, e.g. "ember-4821"
    question: str
    sentence: str  # the fact as the haystack states it

    @property
    def name(self) -> str:
        return f"depth {self.depth:g} @ {self.context_tokens} tokens"


def needle_cells(depths: Sequence[float], lengths: Sequence[int], *, seed: int = 0) -> list[NeedleCell]:
    """The grid, length by length then depth by depth: the same arguments always give the same cells."""
    rng = random.Random(f"swaplab-needle-{seed}")
    cells: list[NeedleCell] = []
    used_vaults: set[str] = set()
    used_facts: set[str] = set()
    for length in lengths:
        for depth in depths:
            vault = rng.choice([name for name in VAULTS if name not in used_vaults] or VAULTS)
            used_vaults.add(vault)
            fact = f"{rng.choice(CODE_WORDS)}-{rng.randrange(1000, 10000)}"
            while fact in used_facts:
                fact = f"{rng.choice(CODE_WORDS)}-{rng.randrange(1000, 10000)}"
            used_facts.add(fact)
            cells.append(NeedleCell(
                depth=depth,
                context_tokens=length,
                fact=fact,
                question=f"What is the access code for the {vault} vault? Answer with the code only.",
                sentence=f"The access code for the {vault} vault is {fact}.",
            ))
    return cells


def filler_sentences(seed: int = 0) -> Iterator[str]:
    """An endless, deterministic stream of filler sentences."""
    rng = random.Random(f"swaplab-needle-filler-{seed}")
    while True:
        sentence = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TIMES)}."
        if rng.random() < 0.3:
            sentence += " " + rng.choice(_AFTERTHOUGHTS)
        yield sentence


def compose(cell: NeedleCell, filler: Sequence[str]) -> str:
    """The user message: instruction, the filler with the fact at the cell's depth, the question."""
    total = sum(len(sentence) + 1 for sentence in filler)
    position, walked = 0, 0
    # The sentence boundary closest to `depth` of the haystack's characters.
    for index, sentence in enumerate(filler):
        if walked >= cell.depth * total:
            break
        walked += len(sentence) + 1
        position = index + 1
    haystack = " ".join([*filler[:position], cell.sentence, *filler[position:]])
    return f"{INSTRUCTION}\n\n{haystack}\n\nQuestion: {cell.question}"


async def fit_prompt(cell: NeedleCell, count: Count, *, seed: int = 0) -> tuple[str, int]:
    """The cell's prompt and its length by `count`: at most `context_tokens`, short of it by less than a sentence.

    (When no haystack fits under the length, the closest one measured, which may be over.)
    """
    stream = filler_sentences(seed)
    pool: list[str] = []

    def first(n: int) -> list[str]:
        while len(pool) < n:
            pool.append(next(stream))
        return pool[:n]

    target = cell.context_tokens
    bare = await count(compose(cell, []))  # instruction, fact and question alone
    sentences = max(1, (target - bare) // TOKENS_PER_SENTENCE_GUESS)
    best: tuple[str, int] | None = None
    last: tuple[str, int] = ("", 0)
    for _ in range(FIT_ROUNDS):
        text = compose(cell, first(sentences))
        tokens = await count(text)
        last = (text, tokens)
        if tokens <= target and (best is None or tokens > best[1]):
            best = last
        per_sentence = max(1.0, (tokens - bare) / sentences)
        wanted = int((target - bare) / per_sentence)
        if tokens > target:
            wanted = min(wanted, sentences - 1)
        if wanted == sentences or wanted < 1:
            break
        sentences = wanted
    return best or last


async def token_counter(client: OpenAIClient, model: str) -> tuple[Count, str]:
    """How prompts are measured here: the server's /tokenize, else the bench's calibration from usage."""
    try:
        await client.tokenize("calibration", model=model)
    except TokenizeUnavailableError:
        from swaplab.bench.target import reach

        target = await reach(client, model, endpoint="chat", rng=random.Random(0))
        per_word = target.prompts.tokens_per_word

        async def estimate(text: str) -> int:
            return round(len(text.split()) * per_word)

        return estimate, target.length_method

    async def tokenize(text: str) -> int:
        return len(await client.tokenize(text, model=model))

    return tokenize, "tokenize"


def found(fact: str, answer: str) -> bool:
    """Whether `answer` states the code: case, and spaces around its hyphen, don't matter."""
    word, digits = fact.split("-")
    return re.search(rf"\b{re.escape(word)}\s*-\s*{digits}\b", answer, re.IGNORECASE) is not None


async def ask_cell(
    client: OpenAIClient, model: str, cell: NeedleCell, sampling: Sampling, count: Count, method: str, *, seed: int = 0
) -> TaskOutcome:
    """One cell: build the prompt, ask, score the answer."""
    prompt, measured = await fit_prompt(cell, count, seed=seed)
    messages = [{"role": "user", "content": prompt}]
    started = perf_counter()
    result = await client.chat(model, messages, max_tokens=sampling.max_tokens, **sampling.parameters())
    wall_seconds = perf_counter() - started
    answer = split_answer(result)
    extra = {
        "depth": cell.depth,
        "context_tokens": cell.context_tokens,
        "measured_tokens": measured,
        "prompt_tokens": result.prompt_tokens,
        "length_method": method,
        "fact": cell.fact,
    }
    if not result.ok:
        status, detail = ERROR, f"the request failed: {result.error}"
    elif found(cell.fact, answer.text):
        status, detail = PASS, f"found {cell.fact}"
    elif answer.truncated:
        status, detail = INCONCLUSIVE, f"still thinking when the {sampling.max_tokens}-token budget ran out"
    else:
        status, detail = FAIL, f"{cell.fact} not in the answer: {answer.text[:120]!r}"
    transcript = [*messages, {"role": "assistant", "content": answer.text, "reasoning": answer.thinking,
                              "finish_reason": result.finish_reason}]
    return TaskOutcome(
        suite="needle", round="needle", task=cell.name, status=status, detail=detail, transcript=transcript,
        requests=[result], steps=1, output_tokens=result.completion_tokens or 0, wall_seconds=wall_seconds,
        extra=extra,
    )


def lengths_that_fit(
    lengths: Sequence[int], context: int | None, answer_budget: int, *, model: str
) -> tuple[list[int], list[str]]:
    """The lengths whose prompt plus answer budget fit `context` (None: unknown, all), and a note per other."""
    fitting = [length for length in lengths if context is None or length + answer_budget <= context]
    notes = [
        f"needle length {length} left out: with the {answer_budget}-token answer budget it is beyond "
        f"{model}'s context of {context} tokens"
        for length in lengths if length not in fitting
    ]
    return fitting, notes


async def run_needle(
    client: OpenAIClient,
    model: str,
    sampling: Sampling,
    *,
    depths: Sequence[float],
    lengths: Sequence[int],
    seed: int = 0,
    notes: list[str] | None = None,
) -> list[TaskOutcome]:
    """Every cell of depths x lengths that fits the model's context, in `needle_cells` order.

    A length whose prompt and answer budget exceed the context the server reports is
    left out, with a line in `notes` when given.
    """
    info = await client.server_info(model)
    fitting, left_out = lengths_that_fit(lengths, info.context_tokens, sampling.max_tokens, model=info.model)
    if notes is not None:
        notes.extend(left_out)
    if not fitting:
        return []
    count, method = await token_counter(client, info.model)
    outcomes = []
    # The grid comes from every length asked for, so a cell's fact doesn't depend on what fits.
    for cell in needle_cells(depths, lengths, seed=seed):
        if cell.context_tokens in fitting:
            outcomes.append(await ask_cell(client, model, cell, sampling, count, method, seed=seed))
    return outcomes
