"""The page's start-up notice: what the background warm-up (engine/startup.py) is doing or did, in words."""
from __future__ import annotations

from .live import progress_bar, stage_words

WAITING_FOR_STARTUP = "The app is still warming up (see the start-up notice at the top); this run starts when it ends."


def startup_words(status: dict, events: dict) -> str:
    """Markdown for a StartUp's status() (and its latest progress events, by worker)."""
    state, seconds = status["state"], status["elapsed_s"]
    if state == "off":
        return ""
    if state == "failed":
        return (f"⚠️ Start-up could not warm up **{status['configuration']}** after {seconds:.0f} s: "
                f"{status['error']}. Edits still run; the first one prepares what it needs.")
    if state == "ready":
        warmed = "; ".join(f"**{item['configuration']}** in {item['seconds']:.1f} s" for item in status["warmed"])
        return f"✅ Ready: warmed up at start-up ({warmed}), so the first edit runs warm."
    lines = [f"⏳ **Starting up** ({seconds:.0f} s): warming up **{status['configuration']}** with a small edit so "
             "that yours runs warm. The page works meanwhile; a Run waits for it."]
    for worker, event in sorted(events.items()):
        where = f"{worker}: " if worker else ""
        lines.append(f"{where}{stage_words(event.stage)}" + (f" — {event.message}" if event.message and
                                                                event.message != event.stage else ""))
        if event.download is not None:
            lines.append(progress_bar(event))
    return "\n\n".join(lines)
