"""The performance charts as static SVG, drawn by matplotlib, the same bytes for the same numbers.

Determinism: a fixed hash salt per chart (matplotlib derives element ids from it; a
different salt per chart keeps ids unique when several charts share a page), no date
in the metadata, and text left as text in one fixed font family (no glyph outlines
that depend on the fonts installed).
"""

from __future__ import annotations

import io
import re
import threading

from swaplab.catalog.performance import Chart

PALETTE = ("#2563eb", "#d97706", "#059669", "#9333ea", "#dc2626", "#0891b2")
BAR_COLOURS = ("#94a3b8", "#059669")  # uncached, cached
TEXT = "#1f2937"
GRID = "#e5e7eb"
# rcParams are process-wide: one chart is drawn at a time (the live catalogue draws in threads).
_DRAWING = threading.Lock()


def chart_svg(chart: Chart, salt: str) -> str:
    """`chart` as an `<svg>` element to inline in a page; `salt` must differ between charts of one page."""
    import matplotlib
    from matplotlib.figure import Figure

    settings = {
        "svg.hashsalt": salt,
        "svg.fonttype": "none",
        "font.family": "sans-serif",
        "font.sans-serif": ["DejaVu Sans"],
        "font.size": 11,
        "legend.fontsize": 9.5,
        "axes.edgecolor": "#9ca3af",
        "axes.labelcolor": TEXT,
        "xtick.color": TEXT,
        "ytick.color": TEXT,
        "axes.spines.top": False,
        "axes.spines.right": False,
    }
    with _DRAWING, matplotlib.rc_context(settings):
        figure = Figure(figsize=(6.0, 3.4), layout="constrained")
        axes = figure.add_subplot()
        if chart.bars:
            _bars(axes, chart)
        else:
            _lines(axes, chart)
        axes.set_title(chart.title, loc="left", fontsize=12, color=TEXT, fontweight="bold")
        axes.set_xlabel(chart.x_label)
        axes.set_ylabel(chart.y_label)
        axes.set_ylim(bottom=0)
        axes.grid(True, axis="y", color=GRID, linewidth=0.8)
        axes.set_axisbelow(True)
        if chart.series:
            axes.legend(frameon=False, loc="best")
        buffer = io.StringIO()
        figure.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    return _inline(buffer.getvalue(), salt)


def _lines(axes, chart: Chart) -> None:
    xs = sorted({point.x for series in chart.series for point in series.points})
    for index, series in enumerate(chart.series):
        colour = PALETTE[index % len(PALETTE)]
        x = [point.x for point in series.points]
        y = [point.y for point in series.points]
        axes.plot(x, y, marker="o", markersize=4, linewidth=1.8, color=colour, label=series.label)
        low = [point.y - point.low if point.low is not None else 0 for point in series.points]
        high = [point.high - point.y if point.high is not None else 0 for point in series.points]
        if any(low) or any(high):  # min-max over repetitions
            axes.errorbar(x, y, yerr=[low, high], fmt="none", ecolor=colour, elinewidth=1, capsize=3)
    if chart.log_x and xs and min(xs) > 0:
        axes.set_xscale("log", base=2)
    if xs:
        axes.set_xticks(xs, [_tick(x) for x in xs])
        axes.minorticks_off()


def _bars(axes, chart: Chart) -> None:
    count = max(len(chart.series), 1)
    width = 0.8 / count
    for index, series in enumerate(chart.series):
        offset = (index - (count - 1) / 2) * width
        x = [point.x + offset for point in series.points]
        y = [point.y for point in series.points]
        low = [point.y - point.low if point.low is not None else 0 for point in series.points]
        high = [point.high - point.y if point.high is not None else 0 for point in series.points]
        axes.bar(
            x, y, width=width * 0.92, color=BAR_COLOURS[index % len(BAR_COLOURS)], label=series.label,
            yerr=[low, high] if any(low) or any(high) else None, capsize=3, ecolor=TEXT,
        )
        for position, point in zip(x, series.points):
            top = point.high if point.high is not None else point.y
            axes.annotate(f"{point.y:.0f} ms", (position, top), textcoords="offset points", xytext=(0, 4),
                          ha="center", fontsize=9, color=TEXT)
    axes.set_xticks(range(len(chart.categories)), chart.categories, fontsize=9)
    # A lone run's bars stay bar-sized rather than filling the whole width.
    padding = 0.5 * max(0, 3 - len(chart.categories))
    axes.set_xlim(-0.5 - padding, len(chart.categories) - 0.5 + padding)
    axes.margins(y=0.12)


def _tick(value: float) -> str:
    """1, 8, 1k, 32k: prompt lengths in thousands of tokens when they are whole kibi-multiples."""
    if value >= 1024 and value % 1024 == 0:
        return f"{value / 1024:g}k"
    return f"{value:g}"


def _inline(svg: str, prefix: str) -> str:
    """The `<svg>` element alone, to sit in a page among others: no XML declaration or doctype,
    sized by the page's CSS, its ids (`figure_1`, `axes_1`, ...) and references to them prefixed."""
    element = svg[svg.index("<svg") :].strip()
    element = re.sub(r'<svg([^>]*?) width="[^"]*" height="[^"]*"', r'<svg\1 role="img"', element, count=1)
    element = re.sub(r'\bid="([^"]+)"', rf'id="{prefix}-\1"', element)
    return re.sub(r'(xlink:href="#|url\(#)([^")]+)', rf"\1{prefix}-\2", element)
