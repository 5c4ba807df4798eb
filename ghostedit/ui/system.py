"""What this machine is and holds: GPU, driver, CUDA, library versions, every backend's availability with its reason,
and the prepared pipelines in the engine's cache."""
from __future__ import annotations

import platform

import pandas as pd
import psutil
import torch

from ..device import cpu_cores, cpu_model, package_version
from ..engine.workers import WorkerPool
from ..telemetry import GIB, MemoryProbe, nvml_module
from ..optimize import registry

LIBRARIES = ("torch", "diffsynth", "transformers", "gradio", "gradio_client", "torchao", "peft", "safetensors",
             "transformer_engine", "flash_attn", "flash-attn-4", "flash_attn_3", "sageattention",
             "nvidia-cudnn-frontend", "spaces")


def _driver_version() -> str | None:
    nvml = nvml_module()
    return nvml.nvmlSystemGetDriverVersion() if nvml is not None else None


def hardware(device: str) -> dict:
    info = {"device": device, "cpu": cpu_model(), "cpu_cores": cpu_cores(),
            "ram_gib": round(psutil.virtual_memory().total / GIB, 1), "python": platform.python_version(),
            "torch_cuda": torch.version.cuda, "gpus": []}
    if torch.cuda.is_available():
        info["driver"] = _driver_version()
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            info["gpus"].append({"name": props.name, "memory_gib": round(props.total_memory / GIB, 1),
                                 "compute_capability": f"{props.major}.{props.minor}"})
    return info


def memory_now(device: str) -> dict:
    """The memory in use now, as the live view reports it: GPU memory allocated by torch, or without a GPU the
    app's host memory (RSS)."""
    sample = MemoryProbe(device).sample()
    return {"label": sample.label, "now_gib": sample.allocated_gib}


def options_json(options: dict) -> dict:
    """{toggle: {choice: {"available", "reason"}}} from the engine's options()."""
    return {toggle: {choice: {"available": available.ok, "reason": available.reason}
                     for choice, available in choices.items()}
            for toggle, choices in options.items()}


def system_report(engine) -> dict:
    """Everything the System tab shows, as JSON (the /system endpoint); it answers at once, even during a run."""
    return {
        "model": {"source": engine.spec.source, "description": engine.spec.description,
                  "loaded": engine.load_count > 0},
        "hardware": hardware(engine.device),
        "libraries": {name: package_version(name) for name in LIBRARIES},
        "options": options_json(engine.options()),
        "placement": engine.placement().describe(),
        "memory": memory_now(engine.device),
        "cached_pipelines": engine.cached(),
        "workers": engine.describe_workers() if isinstance(engine, WorkerPool) else None,
    }


def hardware_markdown(report: dict) -> str:
    hw, model = report["hardware"], report["model"]
    lines = [f"**Model:** {model['description']} ({'loaded' if model['loaded'] else 'loads on the first run'})", ""]
    if hw["gpus"]:
        for gpu in hw["gpus"]:
            lines.append(f"**GPU:** {gpu['name']} · {gpu['memory_gib']} GiB · compute capability "
                         f"{gpu['compute_capability']}")
        lines.append(f"**Driver:** {hw.get('driver') or 'unknown (NVML unavailable)'} · **CUDA (torch build):** "
                     f"{hw['torch_cuda']}")
    else:
        lines.append(f"**GPU:** none: GhostEdit runs on the CPU ({hw['cpu']}, {hw['cpu_cores']} cores), and the "
                     "memory it reports is the app's host memory (RSS)")
    lines.append(f"**Host:** {hw['ram_gib']} GiB RAM · Python {hw['python']}")
    if report.get("workers"):
        lines.append(f"**Workers:** {len(report['workers'])} edits at once, one per worker: " + "; ".join(
            f"worker {w['worker']} on {w['device']} ({w['name']}, pid {w['pid']}, {w['runs']} runs, "
            + ("busy" if w["busy_s"] is not None else "idle") + ("" if w["alive"] else ", restarting") + ")"
            for w in report["workers"]))
    installed = [f"{name} {ver}" for name, ver in report["libraries"].items() if ver]
    missing = [name for name, ver in report["libraries"].items() if not ver]
    lines.append("**Libraries:** " + ", ".join(installed))
    if missing:
        lines.append("**Not installed:** " + ", ".join(missing))
    return "\n\n".join(lines)


def options_table(report: dict) -> pd.DataFrame:
    rows = [{"toggle": toggle, "choice": registry.words(toggle, choice),
             "available here": "yes" if state["available"] else "no", "reason": state["reason"]}
            for toggle, choices in report["options"].items() for choice, state in choices.items()]
    return pd.DataFrame(rows, columns=["toggle", "choice", "available here", "reason"])


def cache_table(cached: list[dict]) -> pd.DataFrame:
    rows = [{"configuration": entry["config"] + (f" on {entry['worker']}" if "worker" in entry else ""),
             "memory GiB (beyond base weights)": round(entry["owned_gib"], 3),
             "prepare s": round(entry["prepare_s"], 3),
             "what each toggle did": "; ".join(f"{k}: {v}" for k, v in entry["report"].items())}
            for entry in cached]
    return pd.DataFrame(rows, columns=["configuration", "memory GiB (beyond base weights)", "prepare s",
                                       "what each toggle did"])
