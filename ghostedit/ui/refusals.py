"""One way to say no. On the page a refusal is its reason in the status panel, kept until the next run, with no
toast and no error badge on inputs that did not fail; an API or MCP client gets the same words as an error
(gradio_client's AppError); the server logs it as one line. Only a bug is logged with its traceback."""
from __future__ import annotations

import html
import logging
import traceback

import gradio as gr

from ..errors import GhostEditError

log = logging.getLogger("ghostedit")
CANNOT_RUN = "Cannot run this"


def from_page(request) -> bool:
    """Whether an event came from the page: Gradio's front end sends `x-gradio-user: app` with every event it
    submits (gradio_client sends "api", Gradio's MCP server "mcp"). Anything else is answered as an API client."""
    headers = getattr(request, "headers", None)
    return headers is not None and headers.get("x-gradio-user") == "app"


def refusal(error: BaseException, title: str = CANNOT_RUN) -> gr.Error:
    """An error as the gr.Error its caller raises (an API client's AppError) and the page's status shows. A
    GhostEditError or gr.Error is a refusal written for the person: logged as one line. Anything else is a bug:
    logged with its traceback and shown as a failure."""
    if isinstance(error, gr.Error):
        error.print_exception = False
        log_refusal(error.title, error.message)
        return error
    if isinstance(error, GhostEditError):
        message = html.escape(str(error), quote=False)
        log_refusal(title, message)
        return gr.Error(message, title=title, print_exception=False)
    traceback.print_exception(error)
    return gr.Error(html.escape(f"{type(error).__name__}: {error}", quote=False), title="Run failed",
                    print_exception=False)


def log_refusal(title: str, message: str) -> None:
    log.warning("refused: %s: %s", title, " ".join(str(message).split()))


def status_words(failure: gr.Error, heading: str = "", during_run: bool = False) -> str:
    """The status panel's words for a refusal (nothing ran) or a run that failed: what could not happen, and why."""
    return f"{heading}### {'❌' if during_run else '⛔'} {failure.title}\n{failure.message}"
