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
        if line.startswith("["):
            end = line.find("]")
            rest = line[end + 1 :].strip() if end != -1 else None
            if rest is not None and (not rest or rest[0] in ";#"):  # a header, maybe with a comment
                current = sections.setdefault(line[1:end].strip(), {})
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
    if text.startswith('"'):
        end = text.find('"', 1)
        if end != -1:
            return text[1:end]
    for marker in ";#":
        if marker in text:
            text = text[: text.index(marker)]
    return text.strip()
