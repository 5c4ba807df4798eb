"""What runs in the browser beside Gradio's components: the page's CSS (the edit screen's grid, the comparison's
cards on a phone) and its script (keyboard, one run per click, the time waited, the theme kept, greyed choices)."""
from __future__ import annotations

import json

CSS = """
/* the edit screen: inputs and Run top left, the settings below them, the status and the result beside them; on a
   narrow screen one column in that order (status and result directly under Run) */
@media (min-width: 1024px) {
  #edit_row {display: grid !important; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr);
             grid-template-rows: auto 1fr; align-items: start; gap: var(--layout-gap)}
  #inputs_col {grid-column: 1; grid-row: 1}
  #settings_col {grid-column: 1; grid-row: 2}
  #output_col {grid-column: 2; grid-row: 1 / span 2}
}
#intro_row {align-items: center}
/* on a phone the start-up notice goes under the title, the whole width, rather than squeezing it */
@media (max-width: 720px) {
  #intro_row {flex-wrap: wrap}
  #startup {order: 3; flex-basis: 100%; min-width: 100% !important}
}
#intro h1 {margin: 0; font-size: 1.5em}
#intro p {margin: 0.2em 0 0}
#status {min-height: 6.5em}
#waited_box {font-size: 0.9em; opacity: 0.85}
#prepare_notice {font-size: 0.92em}
.ghost-note {font-size: 0.9em; opacity: 0.85}
.ghost-progress {width: 100%; height: 0.9em; accent-color: var(--color-accent)}
.ghost-legend {display: flex; flex-wrap: wrap; gap: 0.3em 1em; font-size: 0.85em}
.ghost-legend-item {white-space: nowrap}
.ghost-swatch {display: inline-block; width: 0.8em; height: 0.8em; margin-right: 0.3em; border-radius: 2px}
/* a choice this machine cannot run: greyed, its reason on hover (the page script sets the title) */
.ghost-unavailable {opacity: 0.55}
/* captions of the galleries whole, on as many lines as they need */
#outputs_gallery .caption-label, #run_images .caption-label {white-space: normal; overflow: visible;
                                                                 text-overflow: clip; max-width: none}
/* a batch's or the variants' gallery, hidden while it holds nothing (a single image is the slider's second) */
#run_images:not(:has(img)) {display: none}
/* an output with transparency (Qwen-Image-2.1's RGBA) on a checkerboard */
#result img, #run_images img {background: repeating-conic-gradient(#c8c8c8 0% 25%, #ffffff 0% 50%) 50% / 16px 16px
  !important}
/* the comparison: a table led by the configuration, cards on a phone */
table.ghost-compare {width: 100%; border-collapse: collapse; font-size: 0.92em}
table.ghost-compare th, table.ghost-compare td {padding: 0.35em 0.6em; text-align: right;
                                                 border-bottom: 1px solid var(--border-color-primary)}
table.ghost-compare th[scope=row], table.ghost-compare thead th:first-child {text-align: left}
table.ghost-compare thead th {font-weight: 600; vertical-align: bottom}
.ghost-baseline {font-size: 0.8em; padding: 0 0.4em; border-radius: 0.6em; background: var(--color-accent-soft)}
@media (max-width: 720px) {
  table.ghost-compare thead {display: none}
  table.ghost-compare tr {display: grid; grid-template-columns: 1fr 1fr; gap: 0.1em 0.8em; padding: 0.5em;
                          margin-bottom: 0.6em; border: 1px solid var(--border-color-primary); border-radius: 0.5em}
  table.ghost-compare th[scope=row] {grid-column: 1 / -1; border: none}
  table.ghost-compare td {display: flex; justify-content: space-between; gap: 0.5em; border: none; padding: 0.1em 0}
  table.ghost-compare td::before {content: attr(data-label); opacity: 0.75; text-align: left}
}
"""

# In-page behaviour Gradio has no component for:
# - the theme chosen with the page's switch wins over the system's, in this browser;
# - Enter in the instruction runs (Shift+Enter: a new line), and so does Ctrl/Cmd+Enter anywhere;
# - Run: a double click starts one run (Gradio submits both clicks of a fast double click), and the status comes
#   into view;
# - #waited: the seconds from the click on Run to the picture, measured here (what the person waited, beside the
#   engine's own time in the status); "–" when no picture came (a refusal, a cancel).
PAGE_SCRIPT = """
() => {
  const theme = localStorage.getItem('ghostedit-theme');
  if (theme) document.body.classList.toggle('dark', theme === 'dark');
  document.addEventListener('keydown', (event) => {
    if (event.key !== 'Enter' || event.isComposing) return;
    const inPrompt = event.target.closest && event.target.closest('#prompt');
    if (event.ctrlKey || event.metaKey || (inPrompt && !event.shiftKey)) {
      event.preventDefault();
      document.querySelector('#run').click();
    }
  }, true);
  const clock = {start: null, before: null};
  const pictures = () => [...document.querySelectorAll('#result img')].map((image) => image.src).join(' ');
  const waited = (text) => { const box = document.querySelector('#waited'); if (box) box.textContent = text; };
  document.addEventListener('click', (event) => {
    const run = event.target.closest && event.target.closest('#run, #run_variants');
    if (!run) return;
    if (event.detail > 1) { event.stopImmediatePropagation(); event.preventDefault(); return; }
    clock.start = performance.now();
    clock.before = pictures();
    waited('…');
    document.querySelector('#status')?.scrollIntoView({block: 'nearest', behavior: 'smooth'});
  }, true);
  new MutationObserver(() => {
    if (clock.start === null) return;
    const status = document.querySelector('#status')?.textContent || '';
    if (/[⛔❌⏹]/.test(status)) { clock.start = null; waited('–'); return; }
    const now = pictures();
    const images = [...document.querySelectorAll('#result img')];
    const loaded = images.every((image) => image.complete && image.naturalWidth);
    if (!images.length || now === clock.before || !loaded) return;
    waited(((performance.now() - clock.start) / 1000).toFixed(2));
    clock.start = null;
  }).observe(document.body, {subtree: true, childList: true, attributes: true, attributeFilter: ['src'],
                               characterData: true});
}
"""
TOGGLE_THEME = """
() => {
  const dark = document.body.classList.toggle('dark');
  localStorage.setItem('ghostedit-theme', dark ? 'dark' : 'light');
}
"""
# the click on Run, before the server answers: an earlier run's toasts go, and the status says the run waits its
# turn (the first word from the server replaces it)
QUEUED = """
() => {
  document.querySelectorAll('[data-testid=toast-close]').forEach((button) => button.click());
  return '### ⏳ Queued: the run starts when the runs ahead of it end';
}
"""


def mark_unavailable(reasons: dict[str, str]) -> str:
    """A script that greys every choice this machine cannot run, in the dropdowns and checkbox groups, with its
    reason on hover. `reasons`: {choice label: why} (settings.unavailable_reasons)."""
    return r"""
() => {
  const reasons = %s;
  let queued = false;
  const mark = () => {
    queued = false;
    for (const item of document.querySelectorAll('ul[role=listbox] li[role=option], label')) {
      const reason = reasons[item.textContent.replace(/^\s*✓/, '').trim()];  // a dropdown's tick
      if (reason === undefined || item.dataset.ghostReason === reason) continue;
      item.dataset.ghostReason = reason;
      item.title = reason;
      item.classList.add('ghost-unavailable');
    }
  };
  mark();
  new MutationObserver(() => { if (!queued) { queued = true; requestAnimationFrame(mark); } })
    .observe(document.body, {subtree: true, childList: true});
}
""" % json.dumps(reasons)
