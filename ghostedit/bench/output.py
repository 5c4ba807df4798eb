"""What a bench run writes: results.json (with the environment it ran in and the date), table.md and chart.png."""
from __future__ import annotations

import datetime
import json
import shlex
import sys
import platform
from pathlib import Path

from ..device import cpu_cores, cpu_model, package_version


def markdown_table(rows: list[dict], columns: dict[str, str]) -> str:
    """The rows' `columns` (key: heading) as a markdown table."""
    import pandas as pd
    return pd.DataFrame(rows)[list(columns)].rename(columns=columns).to_markdown(index=False, floatfmt=".3f")


def write_bar_charts(path: Path, title: str, labels: list[str], times: list[float], time_label: str,
                     memory: list[float], memory_label: str) -> None:
    """Time and memory per configuration, side by side, one bar per configuration in run order."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (time_ax, memory_ax) = plt.subplots(1, 2, figsize=(13, 0.55 * len(labels) + 2.5))
    time_ax.barh(labels, times, color="#5b6ee1")
    time_ax.set_xlabel(time_label)
    memory_ax.barh(labels, memory, color="#e1875b")
    memory_ax.set_xlabel(memory_label)
    memory_ax.set_yticks([])
    for ax in (time_ax, memory_ax):
        ax.invert_yaxis()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def environment() -> dict:
    """Where and when a bench ran: the figures it wrote are read with this (ghostedit/figures.py)."""
    import torch
    info = {"date": datetime.date.today().isoformat(), "command": shlex.join(["ghostedit", *sys.argv[1:]]),
            "python": platform.python_version(), "torch": torch.__version__,
            "diffsynth": package_version("diffsynth"), "torchao": package_version("torchao"),
            "cpu": cpu_model(), "cpu_cores": cpu_cores()}
    if torch.cuda.is_available():
        # cuDNN as loaded: a newer one than torch's pin can come first on sys.path (lab/probes/README.md: library_ab.sh)
        info.update(gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version())
    return info


def write_results(out_dir: Path, results: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=2, default=str))
