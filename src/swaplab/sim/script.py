"""`swaplab sim --script FILE`: scripted chat answers (text, reasoning, tool calls) chosen by rules.

A script is plain data (YAML or JSON), so tests can write one from Python with
`json.dump`. Rules are tried in order; the first whose `match` regex is found in the
request's messages answers, with the reply for the conversation's turn (the number of
assistant messages already in the request). See docs/sim.md, "Scripts".
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from swaplab.errors import SwaplabError
from swaplab.sim.tokens import count_words

REPLY_KEYS = ("content", "reasoning", "tool_calls", "finish_reason")
RULE_KEYS = ("match", "replies", "then")
SCRIPT_KEYS = ("rules", "default")
TOOL_CALL_KEYS = ("name", "arguments", "id")
FINISH_REASON = re.compile(r"[A-Za-z_]+")


class ScriptError(SwaplabError):
    """A script file the sim cannot use."""


@dataclass(frozen=True)
class ScriptedToolCall:
    """One function call of a scripted reply; `arguments` is the JSON text the wire carries."""

    name: str
    arguments: str
    id: str | None = None


@dataclass(frozen=True)
class ScriptedReply:
    """One assistant turn: reasoning (sent as `reasoning_content`), then content, then tool calls."""

    content: str = ""
    reasoning: str = ""
    tool_calls: tuple[ScriptedToolCall, ...] = ()
    finish_reason: str = "stop"

    @property
    def completion_tokens(self) -> int:
        """The sim's count: words of the reasoning, the content and each call's name and arguments."""
        calls = sum(count_words(call.name) + count_words(call.arguments) for call in self.tool_calls)
        return count_words(self.reasoning) + count_words(self.content) + calls


@dataclass(frozen=True)
class ScriptRule:
    """Replies for conversations whose messages contain `pattern`; `then` follows the last of them."""

    pattern: re.Pattern[str]
    replies: tuple[ScriptedReply, ...]
    then: ScriptedReply | None = None

    def reply_for(self, turn: int) -> ScriptedReply:
        """The reply to the conversation's `turn`-th assistant turn (0 = the first)."""
        if turn < len(self.replies):
            return self.replies[turn]
        return self.then if self.then is not None else self.replies[-1]


@dataclass(frozen=True)
class Script:
    """The rules in the order they are tried, and the reply when none matches (None: the usual `tok` answer)."""

    rules: tuple[ScriptRule, ...] = ()
    default: ScriptedReply | None = None

    def reply_for(self, messages: Sequence[Any]) -> ScriptedReply | None:
        """The scripted answer to a chat request's `messages`, or None when the script has none."""
        texts = [message_text(message) for message in messages]
        turn = sum(1 for message in messages if isinstance(message, dict) and message.get("role") == "assistant")
        for rule in self.rules:
            if any(rule.pattern.search(text) for text in texts):
                return rule.reply_for(turn)
        return self.default


def message_text(message: Any) -> str:
    """The text a rule's regex is searched in: the message's content (string or text parts)."""
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def load_script(path: str | Path) -> Script:
    """Read a script file (JSON when it ends in .json, else YAML); raises ScriptError saying what is wrong."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise ScriptError(f"sim: cannot read script {path}: {error.strerror or error}") from None
    try:
        document = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as error:
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ScriptError(f"sim: script {path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {first_line}") from None
    return parse_script(document, source=str(path))


def parse_script(document: Any, *, source: str = "script") -> Script:
    """A script from its plain-data form (what the file holds); raises ScriptError naming the bad field."""
    where = f"sim: script {source}"
    if not isinstance(document, Mapping):
        raise ScriptError(f"{where}: must be a mapping with 'rules' and/or 'default'")
    _known_keys(document, SCRIPT_KEYS, where)
    rules_data = document.get("rules") or []
    if not isinstance(rules_data, list):
        raise ScriptError(f"{where}: 'rules' must be a list")
    rules = tuple(_rule(rule, f"{where}: rules[{index}]") for index, rule in enumerate(rules_data))
    default = document.get("default")
    return Script(rules=rules, default=None if default is None else _reply(default, f"{where}: default"))


def _rule(data: Any, where: str) -> ScriptRule:
    if not isinstance(data, Mapping):
        raise ScriptError(f"{where}: must be a mapping with 'match' and 'replies'")
    _known_keys(data, RULE_KEYS, where)
    pattern = data.get("match")
    if not isinstance(pattern, str):
        raise ScriptError(f"{where}: 'match' must be a regular expression (a string)")
    try:
        compiled = re.compile(pattern)
    except re.error as error:
        raise ScriptError(f"{where}: 'match' is not a valid regular expression: {error}") from None
    replies = data.get("replies")
    if not isinstance(replies, list) or not replies:
        raise ScriptError(f"{where}: 'replies' must be a non-empty list")
    then = data.get("then")
    return ScriptRule(
        pattern=compiled,
        replies=tuple(_reply(reply, f"{where}.replies[{index}]") for index, reply in enumerate(replies)),
        then=None if then is None else _reply(then, f"{where}.then"),
    )


def _reply(data: Any, where: str) -> ScriptedReply:
    if isinstance(data, str):  # shorthand: a reply that is only content
        return ScriptedReply(content=data)
    if not isinstance(data, Mapping):
        raise ScriptError(f"{where}: a reply is a string or a mapping of {', '.join(REPLY_KEYS)}")
    _known_keys(data, REPLY_KEYS, where)
    for key in ("content", "reasoning"):
        if not isinstance(data.get(key, ""), str):
            raise ScriptError(f"{where}: '{key}' must be a string")
    calls_data = data.get("tool_calls") or []
    if not isinstance(calls_data, list):
        raise ScriptError(f"{where}: 'tool_calls' must be a list")
    calls = tuple(_tool_call(call, f"{where}.tool_calls[{index}]") for index, call in enumerate(calls_data))
    finish_reason = data.get("finish_reason", "tool_calls" if calls else "stop")
    if not isinstance(finish_reason, str) or not FINISH_REASON.fullmatch(finish_reason):
        raise ScriptError(f"{where}: 'finish_reason' must be a word such as stop, length or tool_calls")
    return ScriptedReply(
        content=data.get("content", ""), reasoning=data.get("reasoning", ""), tool_calls=calls, finish_reason=finish_reason
    )


def _tool_call(data: Any, where: str) -> ScriptedToolCall:
    if not isinstance(data, Mapping):
        raise ScriptError(f"{where}: a tool call is a mapping of {', '.join(TOOL_CALL_KEYS)}")
    _known_keys(data, TOOL_CALL_KEYS, where)
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ScriptError(f"{where}: 'name' must be a non-empty string")
    arguments = data.get("arguments", {})
    # A mapping is encoded here; a string goes out as it is, so a script can send malformed JSON.
    if isinstance(arguments, Mapping):
        arguments = json.dumps(arguments)
    elif not isinstance(arguments, str):
        raise ScriptError(f"{where}: 'arguments' must be a mapping or a JSON string")
    call_id = data.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise ScriptError(f"{where}: 'id' must be a string")
    return ScriptedToolCall(name=name, arguments=arguments, id=call_id)


def _known_keys(data: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = [str(key) for key in data if key not in allowed]
    if unknown:
        raise ScriptError(f"{where}: unknown key {', '.join(map(repr, unknown))} (expected {', '.join(allowed)})")
