"""Tables that stay readable at any width: the compact comparison of runs (a table on a desktop, cards on a phone),
and Gradio tables whose columns are each at least as wide as its longest word (header or cell), scrolling sideways
where the screen is narrower, instead of Gradio's equal split that wraps a header one letter per line on a phone."""
from __future__ import annotations

import html

import gradio as gr
import pandas as pd

CHAR_PX = 8.7        # one character of the table's monospace font (14 px), with a margin for bold headers
CELL_PADDING_PX = 44  # the cell's padding and Gradio's column menu button
LINE_CHARS = 40       # text up to this long keeps to one line where the screen allows (a reason, a prompt)
MAX_COLUMN_PX = 420   # longer words than this wrap (a prompt is text, not one word)


def _text(value) -> str:
    return "" if value is None or (isinstance(value, float) and pd.isna(value)) else str(value)


def longest_word(value) -> int:
    return max((len(word) for word in _text(value).split()), default=0)


def column_widths(frame: pd.DataFrame) -> list[int]:
    """Pixels per column: room for the longest word of its header and of each of its cells, and for a cell's
    whole text up to LINE_CHARS."""
    widths = []
    for column in frame.columns:
        chars = max([longest_word(column)] + [max(longest_word(value), min(len(_text(value)), LINE_CHARS))
                                             for value in frame[column]])
        widths.append(min(MAX_COLUMN_PX, round(chars * CHAR_PX + CELL_PADDING_PX)))
    return widths


def readable(frame: pd.DataFrame) -> gr.Dataframe:
    """The table as an update of a gr.Dataframe, with its column widths."""
    return gr.Dataframe(value=frame, headers=list(frame.columns), column_widths=column_widths(frame))


def comparison_html(rows: list[dict], memory_kind: str) -> str:
    """The comparison a person reads first (History.compact_rows): a table led by the configuration that fits a
    desktop screen without sideways scrolling, and on a phone one card per run (the page's CSS). What each run
    edited (prompt, seed, size, steps) shows on hover and in the table of all columns."""
    if not rows:
        return '<p class="ghost-note">No runs yet: every run joins this comparison.</p>'
    memory = "peak GPU GiB" if memory_kind.startswith("GPU") else "peak RAM GiB (process RSS)"
    headers = ("configuration", "s / step", "speed-up / step", "end to end s", "speed-up end to end", "PSNR dB",
               "SSIM", memory)
    body = []
    for row in rows:
        name = html.escape(row["name"]) + (' <span class="ghost-baseline">baseline</span>' if row["baseline"] else "")
        compiled = f' <span class="ghost-note">(compiling {row["compile_s"]:.1f})</span>' if row["compile_s"] else ""
        cells = (f'<th scope="row" title="{html.escape(row["details"])}">{name}</th>',
                 _cell(headers[1], _number(row["s_per_step"], 3)), _cell(headers[2], _times(row["speedup_step"])),
                 _cell(headers[3], _number(row["total_s"], 2) + compiled),
                 _cell(headers[4], _times(row["speedup_e2e"])),
                 _cell(headers[5], html.escape(row["psnr"]) or "–"), _cell(headers[6], _number(row["ssim"], 4)),
                 _cell(headers[7], _number(row["peak_gib"], 2)))
        body.append(f"<tr>{''.join(cells)}</tr>")
    head = "".join(f'<th scope="col">{html.escape(header)}</th>' for header in headers)
    return (f'<table class="ghost-compare"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>')


def _cell(header: str, text: str) -> str:
    return f'<td data-label="{html.escape(header)}">{text}</td>'


def _number(value, digits: int) -> str:
    """A figure, "–" where there is none, or a word in its place (history.PENDING)."""
    if isinstance(value, str):
        return html.escape(value)
    return "–" if value is None else f"{value:.{digits}f}"


def _times(value) -> str:
    return "–" if value is None else f"{value:.2f}×"
