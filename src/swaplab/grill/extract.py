"""What a model answered, apart from what it thought: reasoning split off, code taken from the last fence.

Servers hand back a model's thinking in one of two ways: separately, as
`reasoning_content` (llama.cpp with a reasoning format, vLLM and SGLang with a reasoning
parser), or inline in the text between markers such as `<think>...</think>`. Inline, the
answer is everything after the LAST end-of-thinking marker: a model may think in several
blocks, and chat templates that open the thought themselves (Qwen3's ends the prompt with
`<think>`) leave only the closing marker in the output.

A thought that was opened and never closed means the answer budget ran out while the
model was still thinking: the answer is `truncated`, scored as a failure counted apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from swaplab.client import RequestResult

# Markers that open and close a thought, as the common model families write them inline:
# DeepSeek-R1 / Qwen3 / QwQ / GLM (<think>), Claude-style and Granite (<thinking>, <reasoning>),
# Kimi (◁think▷), Mistral Magistral ([THINK]), Cohere Command A (<|START_THINKING|>), the
# Open-Thoughts family (<|begin_of_thought|>) and gpt-oss's harmony channels, whose final
# channel header ends the analysis.
THINKING_OPENERS = (
    "<think>",
    "<thinking>",
    "<reasoning>",
    "◁think▷",
    "[THINK]",
    "<|START_THINKING|>",
    "<|begin_of_thought|>",
    "<|channel|>analysis<|message|>",
)
THINKING_CLOSERS = (
    "</think>",
    "</thinking>",
    "</reasoning>",
    "◁/think▷",
    "[/THINK]",
    "<|END_THINKING|>",
    "<|end_of_thought|>",
    "<|channel|>final<|message|>",
)
# Harmony wraps the final answer in more tokens than the header; they are no part of it.
_HARMONY_NOISE = re.compile(r"<\|(?:end|return|call)\|>")

PYTHON_LANGUAGES = ("python", "py", "python3", "py3")


@dataclass(frozen=True)
class Answer:
    """A model's final answer with its thinking taken out."""

    text: str  # the final answer, thinking removed, stripped of surrounding whitespace
    thinking: str  # what the model thought (reasoning_content, or the inline blocks)
    truncated: bool  # the thought never ended: the budget ran out inside it


def split_answer(result: RequestResult) -> Answer:
    """The answer of one request, apart from its thinking (see the module's docstring for the rules)."""
    thinking_parts = [result.reasoning] if result.reasoning else []
    text, inline_thinking, unterminated = split_inline(result.text or "")
    if inline_thinking:
        thinking_parts.append(inline_thinking)
    thinking = "\n".join(thinking_parts)
    # Separated reasoning that was still going when the budget ran out leaves no final text.
    cut_while_reasoning = bool(result.reasoning) and not text and result.finish_reason == "length"
    return Answer(text=text, thinking=thinking, truncated=unterminated or cut_while_reasoning)


def split_inline(text: str) -> tuple[str, str, bool]:
    """(answer, thinking, unterminated) of a text that may hold thinking between markers."""
    close_at, close_end = _last(text, THINKING_CLOSERS)
    thinking = ""
    answer = text
    if close_at >= 0:
        thinking = _strip_openers(text[:close_at])
        answer = text[close_end:]
    open_at, open_end = _last(answer, THINKING_OPENERS)
    unterminated = open_at >= 0
    if unterminated:  # a thought opened after the last close and never ended
        thinking = "\n".join(part for part in (thinking, answer[open_end:].strip()) if part)
        answer = answer[:open_at]
    if "<|" in answer:
        answer = _HARMONY_NOISE.sub("", answer)
    return answer.strip(), thinking.strip(), unterminated


def _last(text: str, markers: tuple[str, ...]) -> tuple[int, int]:
    """Start and end of the last occurrence of any of `markers` in `text`; (-1, -1) when none."""
    best = (-1, -1)
    for marker in markers:
        at = text.rfind(marker)
        if at > best[0]:
            best = (at, at + len(marker))
    return best


def _strip_openers(thinking: str) -> str:
    for marker in THINKING_OPENERS + THINKING_CLOSERS:
        thinking = thinking.replace(marker, "\n")
    return thinking.strip()


# A fence: up to any indentation, three or more backticks or tildes, an info string. Backtick
# fences may not have a backtick in their info string (CommonMark).
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


def last_code_block(text: str, language: str = "python") -> str | None:
    """The content of the last fenced block tagged `language` (or untagged); None when there is none.

    Fences are ``` or ~~~ (three or more, closed by the same character at least as long);
    a fence left open runs to the end of the text, as in CommonMark. For "python" the tags
    py, python3 and py3 count too.
    """
    wanted = PYTHON_LANGUAGES if language == "python" else (language.lower(),)
    found: str | None = None
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None or (opening["fence"][0] == "`" and "`" in opening["info"]):
            index += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        info = opening["info"].strip()
        tag = info.split()[0].lower().lstrip("{.").rstrip("}") if info else ""
        body: list[str] = []
        index += 1
        while index < len(lines):
            closing = _FENCE.match(lines[index])
            if (
                closing is not None
                and closing["fence"][0] == fence[0]
                and len(closing["fence"]) >= len(fence)
                and not closing["info"].strip()
            ):
                break
            body.append(_dedent(lines[index], indent))
            index += 1
        index += 1  # past the closing fence (or the end)
        if tag in wanted or not tag:
            found = "\n".join(body) + "\n" if body else ""
    return found


def _dedent(line: str, indent: int) -> str:
    # A fence indented (inside a list item, say) has its content indented as much: take it off.
    removable = len(line) - len(line.lstrip(" \t"))
    return line[min(indent, removable):]
