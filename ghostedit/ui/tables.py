"""Tables that stay readable at any width: each column at least as wide as its longest word (header or cell), the
table scrolling sideways where the screen is narrower, instead of Gradio's equal split that wraps a header one
letter per line on a phone."""
from __future__ import annotations

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
