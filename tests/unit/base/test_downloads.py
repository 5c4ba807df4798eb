"""Downloads through huggingface_hub against a local fake of the Hub (tests/fake_hub.py), never the network: the size
announced before the first byte, progress with bytes, speed and ETA, a download cut midway resumed, offline use of
the cache, the disk-space refusal, LoRAs by repo id, repo:file and URL, and the CLI's `download` command."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import safetensors.torch
from safetensors import SafetensorError
from huggingface_hub import constants

from ghostedit import downloads
from ghostedit.config import LoraChoice
from ghostedit.downloads import DownloadError, DownloadPlan, DownloadProgress
from ghostedit.models.tiny import tiny_lora_state_dict
from ghostedit.lora_files import LoraError
from tests.fake_hub import Repo, hub_serving
from tests.reference_checkpoints import config_files

REPO = "Qwen/Qwen-Image-Edit-2509"
NEEDED = {  # the released configs, and random bytes where the weights are
    **config_files("Qwen-Image-Edit-2509"),
    "transformer/diffusion_pytorch_model-00001-of-00002.safetensors": os.urandom(1_500_000),
    "transformer/diffusion_pytorch_model-00002-of-00002.safetensors": os.urandom(700_000),
    "text_encoder/model.safetensors": os.urandom(400_000),
    "vae/diffusion_pytorch_model.safetensors": os.urandom(300_000),
    "tokenizer/vocab.json": b"{}",
}
NEEDED_BYTES = sum(len(content) for content in NEEDED.values())
NOT_NEEDED = {"README.md": b"# model card", "examples/big.safetensors": os.urandom(200_000)}
BIG_SHARD = "transformer/diffusion_pytorch_model-00001-of-00002.safetensors"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """The fake Hub with a Qwen-Image-Edit-2509-shaped repo and a LoRA repo; huggingface_hub pointed at it and its
    cache in tmp_path."""
    lora = safetensors.torch.save(tiny_lora_state_dict("peft"))
    repos = {REPO: Repo({**NEEDED, **NOT_NEEDED}),
             "someone/ghost-lora": Repo({"ghost.safetensors": lora, "README.md": b"hi"}),
             "someone/many-loras": Repo({"a.safetensors": lora, "b.safetensors": lora, "c.ckpt": lora,
                                "d/not-a-lora.safetensors": safetensors.torch.save({"w": torch.zeros(2)})})}
    with hub_serving(repos, tmp_path / "hf-cache", monkeypatch) as fake:
        yield fake


def fetch(events=None):
    events = [] if events is None else events
    return downloads.model_folder(REPO, on_progress=events.append, on_plan=events.append), events


def test_size_announced_first_then_progress_with_speed_and_eta(hub):
    hub.bytes_per_second = 4_000_000  # about 0.75 s for the 2.9 MB: several progress reports
    folder, events = fetch()
    plan = events[0]
    assert isinstance(plan, DownloadPlan)
    assert plan.total_bytes == sum(len(data) for data in NEEDED.values())
    assert {f.path for f in plan.files} == set(NEEDED)
    assert "2.9 MB" in plan.summary and "transformer 2.2 MB" in plan.summary
    progress = [e for e in events[1:] if isinstance(e, DownloadProgress)]
    assert len(progress) >= 3 and progress[-1].finished and progress[-1].done_bytes == plan.total_bytes
    done = [p.done_bytes for p in progress]
    assert done == sorted(done) and done[0] < plan.total_bytes
    moving = [p for p in progress if not p.finished and p.speed]
    assert moving and all(p.eta is not None and p.eta >= 0 for p in moving)
    assert any(0.5e6 < p.speed < 20e6 for p in moving), [p.speed for p in moving]
    assert "MB/s" in moving[-1].words and "left" in moving[-1].words
    for path, data in NEEDED.items():
        assert (folder / path).read_bytes() == data
    assert not (folder / "README.md").exists() and not (folder / "examples").exists()
    assert not hub.downloads("README.md") and not hub.downloads("big.safetensors")


def test_a_download_cut_midway_resumes_from_where_it_stopped(hub, monkeypatch):
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)  # what it keeps is whole chunks (10 MB by default)
    hub.drop_first_download.add(f"{REPO}/{BIG_SHARD}")
    folder, events = fetch()
    size = len(NEEDED[BIG_SHARD])
    first, second = hub.downloads(BIG_SHARD)
    assert first is None and second.startswith("bytes=")  # the second request asks only for the rest
    assert size // 4 < int(second.removeprefix("bytes=").rstrip("-")) <= size // 2
    assert (folder / BIG_SHARD).read_bytes() == NEEDED[BIG_SHARD]
    done = [e.done_bytes for e in events if isinstance(e, DownloadProgress)]
    assert done == sorted(done) and done[-1] == events[0].total_bytes  # never counted twice


def test_a_second_fetch_downloads_nothing(hub):
    fetch()
    gets = len(hub.downloads(".safetensors"))
    folder, events = fetch()
    assert len(hub.downloads(".safetensors")) == gets
    assert events[0].bytes_on_disk() == events[0].total_bytes


def test_offline_uses_a_complete_cache_and_refuses_an_empty_one(hub, monkeypatch, tmp_path):
    folder, _ = fetch()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert downloads.model_folder(REPO) == folder
    monkeypatch.delenv("HF_HUB_OFFLINE")
    hub.stop()  # the Hub unreachable: the complete snapshot in the cache is used
    assert downloads.model_folder(REPO) == folder
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(DownloadError, match="cannot be downloaded now.*no complete copy"):
        downloads.model_folder(REPO)


def test_a_download_that_does_not_fit_on_disk_is_refused_before_the_first_byte(hub):
    hub.repos[REPO].listed_sizes[BIG_SHARD] = 10**16
    with pytest.raises(DownloadError, match=r"not enough disk space for Qwen/Qwen-Image-Edit-2509: 10000\.0 TB"):
        fetch()
    assert not hub.downloads(".safetensors")


def test_missing_repo_is_named(hub):
    with pytest.raises(DownloadError, match="nobody/nothing .* is not on the Hub"):
        downloads.model_folder("nobody/nothing")


def test_lora_by_repo_id_file_and_url(hub):
    data = hub.repos["someone/ghost-lora"].files["ghost.safetensors"]
    events = []
    path = downloads.lora_file("someone/ghost-lora", events.append)
    assert path.name == "ghost.safetensors" and path.read_bytes() == data
    assert isinstance(events[0], DownloadPlan) and events[-1].finished and events[-1].total_bytes == len(data)
    assert downloads.lora_file("someone/many-loras:b.safetensors").read_bytes() == data
    assert downloads.lora_file(f"{hub.url}/someone/many-loras/resolve/main/a.safetensors").read_bytes() == data
    assert downloads.lora_file("https://huggingface.co/someone/many-loras/blob/main/a.safetensors").name == "a.safetensors"
    with pytest.raises(DownloadError, match=r"has 3 \.safetensors files \(a\.safetensors, b\.safetensors, d/"):
        downloads.lora_file("someone/many-loras")
    with pytest.raises(DownloadError, match="only safetensors"):
        downloads.lora_file("someone/many-loras:c.ckpt")
    with pytest.raises(DownloadError, match="not on the Hugging Face Hub"):
        downloads.lora_file("https://example.com/x.safetensors")
    with pytest.raises(LoraError, match="holds no LoRA layers"):
        downloads.lora_file("someone/many-loras:d/not-a-lora.safetensors")
    hub.repos["someone/many-loras"].listed_sizes["b.safetensors"] = 5 * 1024**3
    with pytest.raises(DownloadError, match=r"5\.4 GB in 1 file .*: more than the 4\.3 GB allowed here"):
        downloads.lora_file("someone/many-loras:b.safetensors")  # refused before the first byte


def test_a_lora_option_names_a_local_file_or_one_on_the_hub(hub, tmp_path, monkeypatch):
    choice = LoraChoice.parse("someone/many-loras:b.safetensors:0.8:runtime")
    assert (Path(choice.path).name, choice.scale, choice.mode, choice.name) == ("b.safetensors", 0.8, "runtime", "b")
    assert LoraChoice.parse("someone/ghost-lora:0.5").scale == 0.5
    assert not downloads.is_lora_reference("loras/missing.safetensors")  # a missing local file stays local
    monkeypatch.chdir(tmp_path)
    (tmp_path / "someone").mkdir()
    (tmp_path / "someone" / "ghost-lora").write_bytes(b"")
    assert not downloads.is_lora_reference("someone/ghost-lora")  # an existing path wins over a repo id
    assert downloads.is_lora_reference(f"{hub.url}/a/b/resolve/main/c.safetensors")


def test_cli_download_killed_midway_keeps_finished_files_for_the_next_run(hub, tmp_path):
    """`ghostedit download` with the real environment variables (HF_ENDPOINT pointed at the fake), killed midway:
    the next run announces the size, fetches only the files the first one did not finish, and shows progress."""
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "cli-cache"),
           "PYTHONPATH": str(Path(__file__).parents[3])}
    command = [sys.executable, "-m", "ghostedit", "download", REPO]
    hub.bytes_per_second = 200_000  # per file: the VAE is done after 1.5 s, the big shard after 7.5 s
    first = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    blobs = tmp_path / "cli-cache" / "models--Qwen--Qwen-Image-Edit-2509" / "blobs"
    vae = blobs / hub.repos[REPO].etag("vae/diffusion_pytorch_model.safetensors")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not vae.exists():
        time.sleep(0.05)
    first.kill()
    first.wait(timeout=30)
    assert vae.exists() and not (blobs / hub.repos[REPO].etag(BIG_SHARD)).exists()
    hub.bytes_per_second = 600_000  # the big shard again in about 2.5 s: a progress line every second
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert f"Qwen/Qwen-Image-Edit-2509: 2.9 MB in {len(NEEDED)} files" in lines[0]
    assert any("B/s, " in line and " s left" in line for line in lines), out.stdout
    assert "2.9 MB ready" in lines[-2] and lines[-1].startswith("ready: ")
    assert len(hub.downloads("vae/diffusion_pytorch_model.safetensors")) == 1  # kept, not fetched again
    assert Path(lines[-1].removeprefix("ready: "), BIG_SHARD).read_bytes() == NEEDED[BIG_SHARD]


def test_the_page_announces_downloads_streams_their_progress_and_switches_models(hub, tmp_path):
    """The page's Hub controls over a real engine (nothing is loaded): the model picker announces the repo's size
    before any download, a Hub LoRA is fetched with progress into the LoRA folder and selected, and a preset says
    what it needs (here: the tiny model has none). The layout is built with them wired in."""
    import gradio as gr

    from ghostedit.engine import Engine
    from ghostedit.ui.handlers import Handlers
    from ghostedit.ui.hub import HubControls
    from ghostedit.ui.layout import build_app
    handlers = Handlers(Engine("tiny", device="cpu"), tmp_path / "loras")
    assert isinstance(build_app(handlers.engine, tmp_path / "loras"), gr.Blocks)
    controls = HubControls(handlers)
    assert "tiny model has random weights" in controls.preset_notice("lightning-4")
    hub.bytes_per_second = 60_000  # 0.7 s: the page sees progress
    updates = list(controls.fetch_lora("someone/ghost-lora", None, "none", "none", "none"))
    words = [update[0] for update in updates]
    assert "someone/ghost-lora: 42.2 KB in 1 file" in words[0], words
    assert any("%)" in w for w in words) and words[-1].startswith("Fetched `ghost.safetensors`")
    assert updates[-1][1]["value"] == "ghost.safetensors" and (tmp_path / "loras" / "ghost.safetensors").is_file()
    for refused in ("/etc", "someone/huge-model"):  # the API is public: only the offered models
        with pytest.raises(gr.Error):
            controls.switch_model(refused)
    notice, steps, cfg, *slots = controls.switch_model(REPO)
    assert handlers.engine.spec.source == REPO and steps["value"] == 40 and cfg["value"] == 4.0
    assert f"⬇ Qwen/Qwen-Image-Edit-2509: 2.9 MB in {len(NEEDED)} files" in notice and "still to download" in notice
    # the fake Hub has no lightx2v repo: the preset says so before anything runs
    assert "⚠️ lightx2v/Qwen-Image-Lightning (revision main) is not on the Hub" in controls.preset_notice("lightning-4")


def test_the_engine_downloads_a_repo_id_with_progress_events_then_loads_the_folder(hub):
    """A repo id given to the engine: the download's plan and progress arrive as "download" events of the run (what
    the CLI prints and the page's live status shows), then the folder goes to the local loader. The fake repo's
    weights are random bytes, so that loader refuses them: the error is the loader's, after the download."""
    from ghostedit.engine import Engine
    from ghostedit.telemetry import RunRecorder
    from ghostedit.ui.live import Live, live_status, progress_json
    events = []
    with pytest.raises(SafetensorError, match="deserializing header"):  # DiffSynth reading the random "weights"
        Engine(REPO, device="cpu").load(recorder=RunRecorder("cpu", on_progress=events.append))
    downloading = [event for event in events if event.stage == "download"]
    assert downloading[0].message.startswith(f"downloading Qwen/Qwen-Image-Edit-2509: 2.9 MB in {len(NEEDED)} files")
    assert downloading[-1].download["finished"] and downloading[-1].download["total_bytes"] == NEEDED_BYTES
    assert "2.9 MB ready" in live_status(Live(downloading[-1], 1.0))
    assert progress_json(Live(downloading[-1], 1.0))["download"]["done_bytes"] == NEEDED_BYTES
    assert (Path(os.environ["HF_HUB_CACHE"]) / "models--Qwen--Qwen-Image-Edit-2509").is_dir()


def test_a_file_finishing_while_progress_is_measured_counts_as_finished(tmp_path, monkeypatch):
    """huggingface_hub renames `<etag>.<id>.incomplete` into the blob when a file is done; the progress thread may
    list the partial file just before that and read its size just after (the race CI once met)."""
    plan = DownloadPlan(REPO, "main", (downloads.HubFile("a.safetensors", 100, "abc"),), tmp_path)
    partial = tmp_path / "abc.1234.incomplete"
    partial.write_bytes(b"x" * 100)
    stat = Path.stat

    def finishing_stat(path, *args, **kwargs):
        if path == partial and os.path.exists(partial):
            partial.rename(tmp_path / "abc")  # the download finishes between the listing and this read
        return stat(path, *args, **kwargs)
    monkeypatch.setattr(Path, "stat", finishing_stat)
    assert plan.bytes_on_disk() == 100


def test_a_qwen_image_2_1_repo_fetches_what_ghostedit_reads_and_is_recognised_from_it(tmp_path, monkeypatch):
    """A repo in Qwen/Qwen-Image-2.1-Turbo's layout (the tiny one's files, processor/ and no tokenizer/) beside files
    GhostEdit does not read: the plan lists the configs, weights and processor only; the folder is the Turbo."""
    from ghostedit.models import resolve
    from ghostedit.models.qwen_image_21.tiny import ensure_tiny_model

    source = ensure_tiny_model(turbo=True, root=tmp_path / "tiny")
    needed = {str(path.relative_to(source)): path.read_bytes() for path in source.rglob("*") if path.is_file()}
    extra = {"README.md": b"# card", "assets/teaser.png": b"png", "transformer/diffusion_pytorch_model.gguf": b"q"}
    repo = "Qwen/Qwen-Image-2.1-Turbo"
    with hub_serving({repo: Repo({**needed, **extra})}, tmp_path / "hf-cache", monkeypatch):
        events = []
        folder = downloads.model_folder(repo, on_progress=events.append, on_plan=events.append)
    assert {f.path for f in events[0].files} == set(needed)
    assert "processor" in events[0].summary and "tokenizer" not in events[0].summary
    assert resolve(str(folder)).family.name == "Qwen-Image-2.1-Turbo"
