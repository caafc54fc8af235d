"""A YAML syntax error as a person reports it: the line of the mistake, in plain words.

PyYAML says where it gave up, in its parser's terms. For an unclosed quote or bracket that
is lines after the mistake (the end of the file, the next key) and reads `while scanning a
quoted scalar, found unexpected end of stream`. The line a person blames is the one where
the quote or bracket opened, the line with the tab, the key without its `:`. `explain` picks
that line from PyYAML's two marks (`problem_mark`: where it gave up; `context_mark`: where
the construct it was reading began) and, where both point past the mistake, from the tokens
read before the failure; it words the fault for the mistake, naming the line where PyYAML
gave up when that is another.
"""

from __future__ import annotations

import re

import yaml
from yaml.tokens import (
    FlowMappingEndToken,
    FlowMappingStartToken,
    FlowSequenceEndToken,
    FlowSequenceStartToken,
    ScalarToken,
)

PREFIX = "invalid YAML: "
_CLOSERS = {"[": "]", "{": "}"}
_KINDS = {"[": "list", "{": "mapping"}


def explain(error: yaml.MarkedYAMLError, text: str) -> tuple[int, str]:
    """The 1-based line of the mistake behind `error` in `text`, and what is wrong there."""
    problem = error.problem or ""
    context = error.context or ""
    mark = error.problem_mark or error.context_mark
    if mark is None:
        return 1, PREFIX + (problem or context or "the file is not YAML")
    lines = text.split("\n") + [""]  # a mark may sit just past the last line
    line, column = mark.line, mark.column
    if context == "while scanning a quoted scalar" and error.context_mark is not None:
        start = error.context_mark
        quote = text[start.index] if start.index < len(text) else '"'
        return start.line + 1, PREFIX + (
            f"the quote {quote} at column {start.column + 1} is never closed; "
            f"add the closing {quote} where the value ends"
        )
    if context == "while scanning a simple key" and error.context_mark is not None:
        start = error.context_mark
        written = _snippet(lines[start.line][start.column :])
        return start.line + 1, PREFIX + (
            f"'{written}' is no `key: value`: add the ':' after the key (or, if it continues the value above, "
            "indent it as that value)"
        )
    unclosed = _unclosed_before(text, lines, mark, at_end=problem.endswith("'<stream end>'"))
    if unclosed is not None:
        return unclosed
    if problem.startswith("found character '\\t'"):
        if not lines[line][:column].strip():
            return line + 1, PREFIX + "a tab indents this line; YAML indents with spaces only"
        return line + 1, PREFIX + f"a tab at column {column + 1}, where YAML takes only spaces; write a space"
    if problem.startswith("found character") and mark.index < len(text):
        character = text[mark.index]
        return line + 1, PREFIX + (
            f"a value cannot start with {character!r} unquoted (column {column + 1}); put the value in quotes"
        )
    if problem.startswith("found unknown escape character") and mark.index < len(text):
        character = text[mark.index]
        return line + 1, PREFIX + (
            f"'\\{character}' (column {column}) is no escape YAML knows in double quotes; "
            f"write '\\\\{character}' for a backslash, or quote the value with ' instead"
        )
    if problem == "mapping values are not allowed here":
        before = lines[line][:column]
        if ": " in before.strip() + " " and not before.strip().endswith(":"):
            return line + 1, PREFIX + (
                f"a second ': ' on this line (column {column + 1}); put the value in quotes if it holds ': '"
            )
        return line + 1, PREFIX + (
            f"'{_snippet(before.strip())}:' is indented more than the line above it, so YAML reads it as more of "
            "that line's value; indent it as the keys beside it"
        )
    if problem == "sequence entries are not allowed here":
        return line + 1, PREFIX + (
            "a list item ('- ') after a key on its line; put each item on a line of its own below the key"
        )
    if problem.startswith("expected <block end>, but found"):
        return line + 1, PREFIX + _not_in_block(problem, error.context_mark, lines, line, column)
    if problem.startswith("expected the node content, but found") and mark.index < len(text):
        character = text[mark.index]
        return line + 1, PREFIX + (
            f"a value cannot start with {character!r} (column {column + 1}); put the value in quotes"
        )
    if problem.startswith("expected ',' or") and error.context_mark is not None:
        opened = error.context_mark
        kind = _KINDS.get(text[opened.index], "collection") if opened.index < len(text) else "collection"
        return line + 1, PREFIX + (
            f"the {kind} opened at line {opened.line + 1} wants ',' or its closing bracket at column {column + 1}, "
            f"found {_found(problem)}; put a value that holds ': ' or ',' in quotes"
        )
    if problem == "second occurrence" and error.context_mark is not None:
        anchor = re.match(r"&([^\s,\[\]{}]+)", text[mark.index :])
        name = anchor.group(1) if anchor else "?"
        return line + 1, PREFIX + (
            f"the anchor '&{name}' is defined already at line {error.context_mark.line + 1}; give this one another name"
        )
    if problem.startswith("found undefined alias"):
        name = problem.split("'")[1] if problem.count("'") >= 2 else "?"
        return line + 1, PREFIX + f"'*{name}' refers to no anchor: no '&{name}' is defined before it"
    if problem == "but found another document":
        return line + 1, PREFIX + "a second YAML document starts here ('---'); a config file is one document"
    if problem.startswith("expected '<document start>'"):
        return line + 1, PREFIX + (
            "this line is indented less than the first line of the file; the top-level keys must all start at column 1"
        )
    where = ""
    if context and error.context_mark is not None and error.context_mark.line != line:
        where = f" ({context} at line {error.context_mark.line + 1})"
    return line + 1, PREFIX + (problem or context) + where


def _not_in_block(problem: str, context_mark: yaml.Mark | None, lines: list[str], line: int, column: int) -> str:
    """A line that ends a block where the block goes on (`expected <block end>, but found X`)."""
    found = _found(problem)
    block = f"line {context_mark.line + 1}" if context_mark is not None else "above"
    before = lines[line][:column].rstrip()
    if found == "'-'":
        return f"a list item where the mapping that starts at {block} wants a key; indent the item under its key"
    if found in ("'}'", "']'"):
        return f"a {found} that closes nothing; remove it"
    if found == "a value" and before.endswith(("'", '"')):
        return f"text after the value's closing quote (column {column + 1}); put the whole value in quotes"
    indent = len(lines[line]) - len(lines[line].lstrip(" "))
    return (
        f"this line's indentation ({indent} spaces) fits no level of the block that starts at {block}; "
        "indent it as the lines it belongs with"
    )


def _unclosed_before(text: str, lines: list[str], mark: yaml.Mark, at_end: bool) -> tuple[int, str] | None:
    """A bracket or a quote opened before the failure that swallowed the lines after it: the
    failure is past a line indented no deeper than the one it opened on (or the file ends)."""
    opened, quoted = _tokens_before(text, mark.index)
    candidates = []
    if opened is not None and (at_end or _dedented(lines, opened.line, mark.line)):
        bracket = text[opened.index]
        candidates.append((opened.index, opened.line + 1, (
            f"the {_KINDS[bracket]} opened with '{bracket}' at column {opened.column + 1} is never closed; "
            f"add the '{_CLOSERS[bracket]}'"
            + (" (the file ends inside it)" if at_end else f" (YAML read on to line {mark.line + 1} looking for it)")
        )))
    if quoted is not None and _dedented(lines, quoted.start_mark.line, quoted.end_mark.line):
        start = quoted.start_mark
        quote = text[start.index]
        candidates.append((start.index, start.line + 1, (
            f"the quote {quote} at column {start.column + 1} is not closed on this line, so the value runs on "
            f"to line {quoted.end_mark.line + 1}; add the closing {quote} where the value ends"
        )))
    if not candidates:
        return None
    _, line, message = max(candidates)
    return line, PREFIX + message


def _tokens_before(text: str, index: int) -> tuple[yaml.Mark | None, ScalarToken | None]:
    """Of the tokens before `index`: where the innermost bracket still open there opened, and
    the last quoted value written over more than one line."""
    scanner = yaml.SafeLoader(text)
    stack: list[yaml.Mark] = []
    quoted: ScalarToken | None = None
    try:
        while scanner.check_token():
            token = scanner.get_token()
            if token.start_mark.index >= index:
                break
            if isinstance(token, (FlowSequenceStartToken, FlowMappingStartToken)):
                stack.append(token.start_mark)
            elif isinstance(token, (FlowSequenceEndToken, FlowMappingEndToken)) and stack:
                stack.pop()
            elif isinstance(token, ScalarToken) and token.style in ("'", '"'):
                if token.start_mark.line != token.end_mark.line:
                    quoted = token
    except yaml.YAMLError:
        pass
    finally:
        scanner.dispose()
    return (stack[-1] if stack else None), quoted


def _dedented(lines: list[str], first: int, last: int) -> bool:
    """Whether a line after `first`, up to `last` (0-based), is indented no deeper than `first`:
    text a bracket or quote opened on `first` would not run into on purpose."""
    depth = _indent(lines[first])
    for text in lines[first + 1 : last + 1]:
        if text.strip() and not text.lstrip().startswith("#") and _indent(text) <= depth:
            return True
    return False


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _found(problem: str) -> str:
    """What PyYAML found, in words: `'<scalar>'` is a value, `'<stream end>'` the end of the file."""
    found = problem.rsplit("but found ", 1)[-1].rsplit("but got ", 1)[-1]
    return {"'<scalar>'": "a value", "'<stream end>'": "the end of the file"}.get(found, found)


def _snippet(text: str, width: int = 40) -> str:
    text = text.strip()
    return text if len(text) <= width else text[: width - 3] + "..."
