"""What swaplab says about upstreams: a model's and a peer's URL, request filters and timeouts,
and the top-level `upstream:` section (`ignorePaths`)."""

from __future__ import annotations

import re
import warnings
from urllib.parse import urlsplit

from swaplab.config.model import Filters, Timeouts
from swaplab.config.tree import to_plain
from swaplab.config.yamlreader import YamlSection, shown

PROTECTED_PARAMS = ("model",)
"""Request parameters filters may neither strip nor set: routing depends on them."""
DEFAULT_IGNORE_PATHS = (r".*\.(js|json|css|png|gif|jpg|jpeg|ico|txt)$",)
"""llama-swap's `upstream.ignorePaths` when the list is absent or empty: static assets."""


def is_http_url(text: str) -> bool:
    parts = urlsplit(text)
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def read_filters(owner: YamlSection, legacy_names: bool) -> Filters:
    """`filters:` of a model (which may still spell it `strip_params`) or of a peer."""
    section = owner.section("filters")
    if section is None:
        return Filters()
    strip = _strip_params(section, "stripParams")
    if legacy_names:  # read either way: llama-swap accepts it, and uses it when stripParams is empty
        legacy = _strip_params(section, "strip_params")
        strip = strip or legacy
    set_params = _params(section, section.mapping("setParams"), section.where("setParams"))
    by_id: dict[str, dict] = {}
    by_id_section = section.section("setParamsByID")
    if by_id_section is not None:
        for name, entry in by_id_section.entries.items():
            by_id_section.read_keys.add(name)
            where = by_id_section.where(name)
            if entry.item.value is None:
                by_id[name] = {}
            elif not entry.item.is_mapping:
                by_id_section.fault(entry, f"expected a mapping of parameters, got {shown(entry.item)}")
            else:
                by_id[name] = _params(section, entry.item, where)
    section.finish()
    return Filters(strip_params=strip, set_params=set_params, set_params_by_id=by_id)


def _params(section: YamlSection, item, where: str) -> dict:
    """A mapping of request parameters, `model` dropped with a warning (it cannot be set)."""
    if item is None:
        return {}
    params = to_plain(item)
    for name in PROTECTED_PARAMS:
        if name in params:
            del params[name]
            section.findings.warn(item.value[name].key_line, f"{where}.{name}: '{name}' cannot be set; ignored")
    return params


def _strip_params(section: YamlSection, key: str) -> tuple[str, ...]:
    entry = section.entry(key)
    if entry is None:
        return ()
    if entry.item.is_sequence:
        names = [item.text for item in section.strings(key)]
    elif entry.item.is_scalar:
        names = entry.item.text.split(",")
    else:
        section.fault(entry, f"expected a comma-separated string or a list, got {shown(entry.item)}")
        return ()
    # llama-swap's sanitising: trimmed, deduplicated, sorted, `model` never stripped.
    return tuple(sorted({name.strip() for name in names} - {"", *PROTECTED_PARAMS}))


def read_timeouts(owner: YamlSection, response_header: float | None) -> Timeouts:
    """`timeouts:` in seconds, 0 meaning no limit; llama-swap's defaults (Go's http.DefaultTransport)."""
    defaults = Timeouts(
        connect=30.0,
        response_header=response_header,
        idle_conn=90.0,
        keepalive=30.0,
        tls_handshake=10.0,
        expect_continue=1.0,
    )
    section = owner.section("timeouts")
    if section is None:
        return defaults

    def read(key: str, default: float | None) -> float | None:
        value = section.number(key, default)
        return None if value == 0 else value

    timeouts = Timeouts(
        connect=read("connect", defaults.connect),
        response_header=read("responseHeader", defaults.response_header),
        idle_conn=read("idleConn", defaults.idle_conn),
        keepalive=read("keepalive", defaults.keepalive),
        tls_handshake=read("tlsHandshake", defaults.tls_handshake),
        expect_continue=read("expectContinue", defaults.expect_continue),
    )
    section.finish()
    return timeouts


def read_ignore_paths(section: YamlSection | None) -> tuple[str, ...]:
    """`upstream.ignorePaths`: regular expressions, each compiled here; absent or `[]` is the default.

    llama-swap compiles them as Go RE2, swaplab matches them with Python's `re`. The syntax
    the two share means the same; a pattern either one refuses, or the two read
    differently, is a fault here, so a pattern never silently matches differently: what
    Python cannot compile (RE2's `\\z`, `\\pL`, `\\Q..\\E`), what RE2 refuses but Python
    accepts (lookaround, backreferences, atomic groups, possessive repeats, `\\Z`, flags
    other than i, m, s), and POSIX classes (`[[:alpha:]]`, a set of characters to Python).
    """
    if section is None:
        return DEFAULT_IGNORE_PATHS
    patterns = []
    for item in section.strings("ignorePaths"):
        problem = _regex_problem(item.text)
        if problem is not None:
            section.findings.fault(
                item.line, f'upstream.ignorePaths: invalid regular expression "{item.text}": {problem}'
            )
        else:
            patterns.append(item.text)
    section.finish()
    return tuple(patterns) or DEFAULT_IGNORE_PATHS


def _regex_problem(pattern: str) -> str | None:
    """Why `pattern` is no regular expression both RE2 and Python's `re` read alike, or None."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # "possible nested set": refused below
            re.compile(pattern)
    except re.error as error:
        return f"{error} (swaplab matches with Python's re)"
    index, in_class = 0, False
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            following = pattern[index + 1 : index + 2]
            if not in_class and following.isdigit() and following != "0":
                return f"backreference \\{following} (RE2, which llama-swap uses, has none)"
            if following == "Z":
                return "\\Z (RE2, which llama-swap uses, has none; its \\z is Python's \\Z)"
            index += 2
            continue
        if in_class:
            if pattern.startswith("[:", index):
                return "a POSIX class such as [[:alpha:]] (Python's re reads it as a set of characters)"
            in_class = char != "]"
        elif pattern.startswith("(?", index):
            problem = _group_problem(pattern[index + 2 :])
            if problem is not None:
                return f"{problem} (RE2, which llama-swap uses, has none)"
        elif char == "[":
            in_class = True
            if pattern.startswith("[:", index + 1):
                return "a POSIX class such as [[:alpha:]] (Python's re reads it as a set of characters)"
            if pattern[index + 1 : index + 2] == "]" or pattern[index + 1 : index + 3] == "^]":
                index += 1 if pattern[index + 1] == "]" else 2  # a leading ] is a literal
        elif char == "+" and index > 0 and pattern[index - 1] in "*+?}" and not _escaped(pattern, index - 1):
            return "possessive repeat (RE2, which llama-swap uses, has none)"
        index += 1
    return None


def _group_problem(rest: str) -> str | None:
    """What is Python-only about a group whose text after `(?` is `rest`, or None."""
    if rest.startswith((":", "P<")):
        return None
    if rest.startswith(("=", "!", "<=", "<!")):
        return "lookaround"
    if rest.startswith(">"):
        return "atomic group"
    if rest.startswith(("P=", "P>", "(")):
        return "backreference or conditional"
    if rest.startswith("#"):
        return "comment group"
    flags = re.match(r"[a-zA-Z-]*", rest).group(0)
    unknown = sorted(set(flags) - set("ims-"))
    return f"flag {''.join(unknown)}" if unknown else None


def _escaped(pattern: str, index: int) -> bool:
    backslashes = 0
    while index - backslashes - 1 >= 0 and pattern[index - backslashes - 1] == "\\":
        backslashes += 1
    return backslashes % 2 == 1
