"""Server-rendered SVG charts for the admin (no JavaScript, no CDN): a decision's
attempt timeline and the dashboard's bar charts. Pure functions: data in, markup out;
every text goes through :func:`django.utils.html.escape`.

Text, axes and outlines are drawn in ``currentColor`` (the page's text colour, inherited
by an inline SVG), quieter parts with an opacity: the charts read in the admin's light
and dark colour schemes alike. Only the data colours (:data:`COLORS`) are fixed."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

__all__ = [
    "COLORS",
    "Bar",
    "Segment",
    "TimelineItem",
    "bar_chart_svg",
    "nice_ticks",
    "stacked_bar_chart_svg",
    "timeline_svg",
]

COLORS = {
    "ok": "#3c8d40",
    "served": "#2b7a2f",
    "error": "#c0392b",
    "skipped": "#9e9e9e",
    "hedge_lost": "#7b5ea7",
    "hedge_skipped": "#b39ddb",
    "p50": "#417690",
    "p95": "#e0a030",
    "bar": "#417690",
}

FONT = (
    'font-family="-apple-system, Segoe UI, Helvetica, Arial, sans-serif" font-size="12" '
    'fill="currentColor"'
)
#: Secondary text (axis ticks, values) and grid lines: the text colour, fainter.
QUIET = 'fill="currentColor" fill-opacity="0.75"'
GRID = 'stroke="currentColor" stroke-opacity="0.18"'


def _fmt(value: float) -> str:
    """A rounded figure for people: 1234 → "1234", 12.3456 → "12.3", 0.04 → "0.04"."""
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}".rstrip("0").rstrip(".")
    return f"{value:.2f}".rstrip("0").rstrip(".") or "0"


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """Round axis ticks from 0 to at least ``top`` (1-2-5 steps)."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    ticks = [0.0]
    while ticks[-1] < top:
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


@dataclass(frozen=True)
class TimelineItem:
    index: int
    provider: str
    outcome: str  # ok | error | skipped
    latency_ms: float
    retries: int = 0
    reason: str = ""
    served: bool = False
    http_status: int | None = None


def timeline_svg(items: Sequence[TimelineItem], *, width: int = 640) -> SafeString:
    """Each attempt a bar on a millisecond axis, in walk order (each starts where the
    previous ended); skips are markers with their reason; retries are ticks dividing a
    bar into its upstream requests; the served attempt is outlined."""
    left, right, row_h, top = 110, 200, 28, 10  # the right margin holds the last label
    plot_w = width - left - right
    total = sum(max(0.0, i.latency_ms) for i in items)
    ticks = nice_ticks(total or 1.0)
    scale = plot_w / ticks[-1]
    height = top + row_h * max(1, len(items)) + 34
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="llmr-timeline" role="img" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" {FONT}>',
        f"<title>Attempts on a millisecond axis, {_fmt(total)} ms in all</title>",
    ]
    axis_y = top + row_h * max(1, len(items))
    for t in ticks:
        x = left + t * scale
        parts.append(
            f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{axis_y}" {GRID}/>'
            f'<text x="{x:.1f}" y="{axis_y + 14}" text-anchor="middle" {QUIET}>'
            f"{_fmt(t)}</text>"
        )
    parts.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{axis_y + 29}" text-anchor="middle" '
        f"{QUIET}>ms</text>"
    )
    start = 0.0
    for row, item in enumerate(items):
        y = top + row * row_h
        label = escape(f"#{item.index} {item.provider}")
        parts.append(f'<text x="{left - 8}" y="{y + 18}" text-anchor="end">{label}</text>')
        x = left + start * scale
        if item.outcome == "skipped":
            reason = escape(item.reason or "skipped")
            parts.append(
                f'<g class="llmr-skip"><title>skipped: {reason}</title>'
                f'<path d="M{x:.1f} {y + 6} l7 7 l-7 7 l-7 -7 z" fill="{COLORS["skipped"]}"/>'
                f'<text x="{x + 12:.1f}" y="{y + 18}" {QUIET}>skipped: {reason}</text></g>'
            )
            continue
        w = max(2.0, item.latency_ms * scale)
        color = COLORS["served"] if item.served else COLORS.get(item.outcome, COLORS["bar"])
        outline = ' stroke="currentColor" stroke-width="3"' if item.served else ""
        status = f" {item.http_status}" if item.http_status else ""
        what = "served" if item.served else (item.reason or item.outcome)
        retries = ""
        if item.retries:
            retries = f", {item.retries} retr{'y' if item.retries == 1 else 'ies'}"
        detail = escape(f"{what}{status}, {_fmt(item.latency_ms)} ms{retries}")
        parts.append(
            f'<g class="llmr-bar llmr-bar-{escape(item.outcome)}'
            f'{" llmr-served" if item.served else ""}"><title>{detail}</title>'
            f'<rect x="{x:.1f}" y="{y + 4}" width="{w:.1f}" height="{row_h - 10}" rx="3" '
            f'fill="{color}"{outline}/>'
        )
        for r in range(1, item.retries + 1):  # one tick per retry
            tx = x + w * r / (item.retries + 1)
            parts.append(
                f'<line class="llmr-retry" x1="{tx:.1f}" y1="{y + 2}" x2="{tx:.1f}" '
                f'y2="{y + row_h - 4}" stroke="#fff" stroke-width="2" stroke-dasharray="3 2"/>'
            )
        parts.append(f'<text x="{x + w + 6:.1f}" y="{y + 18}">{detail}</text></g>')
        start += max(0.0, item.latency_ms)
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - every text above is escaped


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    color: str = COLORS["bar"]
    hint: str = ""  # shown in the bar's tooltip after the label (e.g. the raw reason)


def bar_chart_svg(
    title: str, bars: Sequence[Bar], *, unit: str = "", width: int = 460
) -> SafeString:
    """Horizontal bars, one per label, value printed at the end."""
    left, right, row_h, top = 150, 60, 22, 26
    plot_w = width - left - right
    height = top + row_h * max(1, len(bars)) + 8
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="llmr-bars" role="img" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" {FONT}>',
        f"<title>{escape(title)}</title>",
        f'<text x="0" y="15" font-weight="bold">{escape(title)}</text>',
    ]
    top_value = max((b.value for b in bars), default=0.0) or 1.0
    if not bars:
        parts.append(f'<text x="{left}" y="{top + 15}" {QUIET}>no data</text>')
    for row, bar in enumerate(bars):
        y = top + row * row_h
        w = max(1.0, bar.value / top_value * plot_w) if bar.value > 0 else 0.0
        parts.append(
            f'<text x="{left - 6}" y="{y + 14}" text-anchor="end">{escape(bar.label)}</text>'
            f'<rect x="{left}" y="{y + 3}" width="{w:.1f}" height="{row_h - 8}" '
            f'fill="{escape(bar.color)}"><title>{escape(bar.label)}'
            f"{escape(f' ({bar.hint})' if bar.hint else '')}: {_fmt(bar.value)}"
            f"{escape(unit)}</title></rect>"
            f'<text x="{left + w + 4:.1f}" y="{y + 14}" {QUIET}>{_fmt(bar.value)}'
            f"{escape(unit)}</text>"
        )
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - every text above is escaped


@dataclass(frozen=True)
class Segment:
    name: str
    value: float
    color: str


def stacked_bar_chart_svg(
    title: str, rows: Sequence[tuple[str, Sequence[Segment]]], *, width: int = 460
) -> SafeString:
    """One horizontal stacked bar per label (e.g. attempts by outcome per provider)."""
    left, right, row_h, top = 150, 60, 22, 44
    plot_w = width - left - right
    height = top + row_h * max(1, len(rows)) + 8
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="llmr-stacked" role="img" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" {FONT}>',
        f"<title>{escape(title)}</title>",
        f'<text x="0" y="15" font-weight="bold">{escape(title)}</text>',
    ]
    legend: dict[str, str] = {}
    for _, segments in rows:
        for s in segments:
            legend.setdefault(s.name, s.color)
    lx = 0
    for name, color in legend.items():
        parts.append(
            f'<rect x="{lx}" y="24" width="10" height="10" fill="{escape(color)}"/>'
            f'<text x="{lx + 14}" y="33">{escape(name)}</text>'
        )
        lx += 20 + 8 * len(name)
    top_value = max((sum(s.value for s in segs) for _, segs in rows), default=0.0) or 1.0
    if not rows:
        parts.append(f'<text x="{left}" y="{top + 15}" {QUIET}>no data</text>')
    for row, (label, segments) in enumerate(rows):
        y = top + row * row_h
        x = float(left)
        parts.append(f'<text x="{left - 6}" y="{y + 14}" text-anchor="end">{escape(label)}</text>')
        for s in segments:
            w = s.value / top_value * plot_w
            if w <= 0:
                continue
            parts.append(
                f'<rect x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{row_h - 8}" '
                f'fill="{escape(s.color)}"><title>{escape(label)} {escape(s.name)}: '
                f"{_fmt(s.value)}</title></rect>"
            )
            x += w
        parts.append(
            f'<text x="{x + 4:.1f}" y="{y + 14}" {QUIET}>'
            f"{_fmt(sum(s.value for s in segments))}</text>"
        )
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - every text above is escaped
