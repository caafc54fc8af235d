"""The site's pages from a gathered `Site`: Jinja2 templates, markdown-it-py notes, Pygments YAML, matplotlib charts.

Every page is addressed by its path in the site (`index.html`, `models/ID.html`,
`notes/STEM.html`, `catalog.css`, `catalog.js`) and rendered on its own, so the static
build writes them all and the live catalogue renders only the one asked for. Links
are relative, so the same bytes work from `file://` and under `/catalog/`.
"""

from __future__ import annotations

import time
from collections.abc import MutableMapping
from importlib import resources
from pathlib import Path

import jinja2
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import YamlLexer

from swaplab import __version__
from swaplab.catalog.charts import chart_svg
from swaplab.catalog.figures import number
from swaplab.catalog.performance import Chart
from swaplab.catalog.site import ModelPage, NotePage, Site
from swaplab.notes.wikilinks import render as render_markdown

STYLESHEET = "catalog.css"
SCRIPT = "catalog.js"
PYGMENTS_STYLE = "default"
CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}

ChartCache = MutableMapping[tuple[str, Chart], str]
"""SVG by (salt, chart): charts are the slow part, and their numbers rarely change between builds."""

_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("swaplab.catalog", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)
_TEMPLATES.globals["number"] = number


class SiteRenderer:
    """Renders the pages of one `Site`, stamped with one generation time."""

    def __init__(self, site: Site, generated_at: float | None = None, charts: ChartCache | None = None):
        self.site = site
        self.generated_at = time.time() if generated_at is None else generated_at
        self.charts: ChartCache = charts if charts is not None else {}
        self._models = {f"models/{page.page}.html": page for page in site.models}
        self._notes = {f"notes/{page.page}.html": page for page in site.notes}

    def paths(self) -> list[str]:
        """Every file of the site."""
        return ["index.html", STYLESHEET, SCRIPT, *self._models, *self._notes]

    def render(self, path: str) -> bytes | None:
        """The file at `path` in the site, or None when there is none."""
        if path in ("", "index.html"):
            return self._page("index.html", "", **self._index()).encode()
        if path == STYLESHEET:
            return stylesheet().encode()
        if path == SCRIPT:
            return _static(SCRIPT).encode()
        if path in self._models:
            return self._model(self._models[path]).encode()
        if path in self._notes:
            return self._note(self._notes[path]).encode()
        return None

    # -- pages --------------------------------------------------------------------------

    def _page(self, template: str, root: str, **values: object) -> str:
        stamp = time.localtime(self.generated_at)
        return _TEMPLATES.get_template(template).render(
            site=self.site,
            root=root,
            version=__version__,
            generated=time.strftime("%Y-%m-%d %H:%M %Z", stamp),
            generated_iso=time.strftime("%Y-%m-%dT%H:%M:%S%z", stamp),
            note_pages=self.site.note_pages,
            config_name=Path(self.site.sources.config).name,
            **values,
        )

    def _index(self) -> dict[str, object]:
        local = [page for page in self.site.models if page.model.origin != "peer"]
        peers = [page for page in self.site.models if page.model.origin == "peer"]
        origins = [page.model.origin for page in self.site.models]
        counts = {origin: origins.count(origin) for origin in ("local", "peer", "retired")}
        return {"local": local, "peers": peers, "counts": counts}

    def _model(self, page: ModelPage) -> str:
        root = "../"
        charts = [self._chart(chart, f"chart-{page.page}-{chart.key}") for chart in page.performance.charts]
        # A note sits under the page's h2 "Notes" and its own h3 title.
        notes = [render_markdown(match.note.body, lambda name: self.site.link(name, root), 3) for match in page.notes]
        return self._page(
            "model.html", root, page=page, charts=charts, rendered_notes=notes, entry_html=highlight_yaml(page.model.entry)
        )

    def _note(self, page: NotePage) -> str:
        root = "../"
        body = render_markdown(page.note.body, lambda name: self.site.link(name, root), 1)
        return self._page("note.html", root, page=page, body=body)

    def _chart(self, chart: Chart, salt: str) -> str:
        key = (salt, chart)
        svg = self.charts.get(key)
        if svg is None:
            svg = self.charts[key] = chart_svg(chart, salt)
        return svg


def highlight_yaml(text: str) -> str:
    """`text` as highlighted HTML spans, every character kept (comments, blank lines, trailing spaces)."""
    if not text:
        return ""
    html = highlight(text, YamlLexer(stripnl=False, ensurenl=False), HtmlFormatter(nowrap=True))
    # The YAML lexer ends its last line whatever the text did; `<pre>` would show that newline.
    return html[:-1] if html.endswith("\n") and not text.endswith("\n") else html


def stylesheet() -> str:
    """The one CSS file: the site's own rules, then Pygments' for the highlighted config entry."""
    formatter = HtmlFormatter(style=PYGMENTS_STYLE)
    rules = [*formatter.get_background_style_defs(".highlight"), *formatter.get_token_style_defs(".highlight")]
    return _static(STYLESHEET) + f"\n/* Pygments, style '{PYGMENTS_STYLE}' */\n" + "\n".join(rules) + "\n"


def _static(name: str) -> str:
    return resources.files("swaplab.catalog").joinpath("static", name).read_text(encoding="utf-8")


def content_type(path: str) -> str:
    return CONTENT_TYPES.get(Path(path).suffix, "application/octet-stream")
