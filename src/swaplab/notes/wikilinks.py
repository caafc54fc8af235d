"""`[[name]]` and `[[name|label]]` in markdown: a markdown-it-py inline rule, where each link is, and how it renders.

The same parser finds links for `notes check` and renders them for the site, so a link
inside a code span is neither checked nor linked, in both.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from html import escape

from markdown_it import MarkdownIt
from markdown_it.rules_inline import StateInline

WIKILINK = re.compile(r"\[\[([^\[\]|\n]+)(?:\|([^\[\]\n]+))?\]\]")

Resolver = Callable[[str], "str | None"]
"""A link target's name to the href of its page (relative to the page being rendered), or None when broken."""


@dataclass(frozen=True)
class Wikilink:
    target: str
    label: str
    line: int
    """1-based line in the markdown text the link was found in."""


def _wikilink_rule(state: StateInline, silent: bool) -> bool:
    if not state.src.startswith("[[", state.pos):
        return False
    match = WIKILINK.match(state.src, state.pos)
    if match is None or not match.group(1).strip():
        return False
    if not silent:
        target = match.group(1).strip()
        token = state.push("wikilink", "", 0)
        token.meta = {"target": target, "label": (match.group(2) or target).strip(), "offset": state.pos}
    state.pos = match.end()
    return True


def _render_wikilink(renderer, tokens, index, options, env) -> str:
    meta = tokens[index].meta
    resolve: Resolver | None = env.get("resolve_wikilink")
    href = resolve(meta["target"]) if resolve is not None else None
    label = escape(meta["label"])
    if href is None:
        # Marked and not a link: the reader sees the name and that nothing is behind it.
        return (
            f'<span class="wikilink broken" title="no note or model named {escape(meta["target"])}">'
            f"[[{label}]]</span>"
        )
    return f'<a class="wikilink" href="{escape(href)}">{label}</a>'


def _render_heading(renderer, tokens, index, options, env) -> str:
    # A note's headings sit below the page's own: `heading_offset` levels down, h6 at most.
    token = tokens[index]
    token.tag = f"h{min(6, int(token.tag[1]) + env.get('heading_offset', 0))}"
    return renderer.renderToken(tokens, index, options, env)


def wikilinks_plugin(md: MarkdownIt) -> None:
    """Teach `md` wikilinks: parsed before ordinary links, rendered through `env["resolve_wikilink"]`."""
    md.inline.ruler.before("link", "wikilink", _wikilink_rule)
    md.add_render_rule("wikilink", _render_wikilink)


def markdown() -> MarkdownIt:
    """The notes' markdown: CommonMark plus tables, strikethrough and wikilinks; raw HTML shown as text."""
    md = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])
    md.use(wikilinks_plugin)
    md.add_render_rule("heading_open", _render_heading)
    md.add_render_rule("heading_close", _render_heading)
    return md


_MARKDOWN = markdown()


def find_wikilinks(text: str) -> Iterator[Wikilink]:
    """Every wikilink in markdown `text`, in order, with its line."""
    for block in _MARKDOWN.parse(text):
        if block.type != "inline" or not block.children or block.map is None:
            continue
        for token in block.children:
            if token.type == "wikilink":
                offset = token.meta["offset"]
                line = block.map[0] + 1 + block.content.count("\n", 0, offset)
                yield Wikilink(token.meta["target"], token.meta["label"], line)


def render(text: str, resolve: Resolver, heading_offset: int = 0) -> str:
    """`text` as HTML, each wikilink resolved by `resolve` or marked broken; `# A` becomes `<h{1 + heading_offset}>`."""
    return _MARKDOWN.render(text, {"resolve_wikilink": resolve, "heading_offset": heading_offset})
