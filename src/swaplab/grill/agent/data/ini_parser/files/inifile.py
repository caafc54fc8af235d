"""A small INI reader: `[section]` headers, `key = value` lines, `;` and `#` comments."""


class ParseError(ValueError):
    """A line that is neither a section, a setting, a comment nor blank; says which line."""


def parse(text):
    """{section: {key: value}}; keys before any section go under "". Keys are lower-cased,
    values stripped; a value in double quotes keeps its inner text as it is (comment
    characters included); elsewhere `;` or `#` starts a comment that runs to the end of the line."""
    sections = {"": {}}
    current = sections[""]
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in ";#":
            continue
        if line.startswith("[") and line.endswith("]"):
            name = line[1:-1].strip()
            current = sections.setdefault(name, {})
            continue
        if "=" not in line:
            raise ParseError(f"line {number}: expected 'key = value', got {raw!r}")
        key, value = line.split("=", 1)
        current[key.strip().lower()] = _value(value)
    if not sections[""]:
        del sections[""]
    return sections


def _value(text):
    text = text.strip()
    for marker in ";#":
        if marker in text:
            text = text[: text.index(marker)]
    return text.strip()
