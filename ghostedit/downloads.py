"""Downloads a person can watch: a model repo or a LoRA file from the Hugging Face Hub (or ModelScope) into the
local cache, through huggingface_hub (modelscope's own snapshot API for ModelScope).

Before the first byte it says how big the download is (from the repo's file listing, only the files GhostEdit
reads) and refuses if the disk cannot hold it. While it runs, progress (bytes, speed, ETA) goes to a callback,
measured from the files growing in the cache, so it counts what huggingface_hub really wrote whatever transfer it
used. Interrupted downloads resume: a connection cut midway is resumed from its last byte by huggingface_hub
(ranged requests, within the same run), and a run stopped outright (Ctrl+C, a crash) keeps every finished file, so
the next run fetches only the rest. huggingface_hub 2.x writes each file to a temporary file private to its process
and deletes it on failure, so a file cut off with its process starts again from its first byte. Offline
(HF_HUB_OFFLINE=1, or the Hub unreachable), a complete copy in the cache is used as it is; an incomplete one is
refused with the reason.
"""
from __future__ import annotations

import fnmatch
import os
import re
import shutil
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import unquote, urlparse

from .errors import GhostEditError
from .lora_files import MAX_LORA_BYTES, check_lora_file

# What GhostEdit reads from a Qwen-Image-Edit or Qwen-Image-2.1 repo (each model's configs, its safetensors weights
# and their index, the tokenizer and processor files): the rest (examples, READMEs, other formats) is not fetched
MODEL_PATTERNS = ("model_index.json", "scheduler/scheduler_config.json", "transformer/config.json",
                  "transformer/diffusion_pytorch_model*.safetensors*", "text_encoder/config.json",
                  "text_encoder/model*.safetensors*", "vae/config.json", "vae/diffusion_pytorch_model*.safetensors*",
                  "tokenizer/*", "processor/*")
MODELSCOPE_PREFIX = "modelscope:"
DISK_MARGIN_BYTES = 1 << 30  # left free after a download: a full disk breaks more than the download
POLL_SECONDS = 0.25
SPEED_WINDOW_SECONDS = 5.0
REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


class DownloadError(GhostEditError, RuntimeError):
    """A download that cannot start or finish: no space, no network and no cached copy, a missing repo or file."""


@dataclass(frozen=True)
class DownloadProgress:
    """One look at a download: bytes on disk of the bytes needed, the speed over the last seconds, the time left."""
    what: str
    done_bytes: int
    total_bytes: int
    speed: float | None        # bytes per second
    eta: float | None          # seconds
    finished: bool = False

    @property
    def fraction(self) -> float:
        return self.done_bytes / self.total_bytes if self.total_bytes else 1.0

    @property
    def words(self) -> str:
        if self.finished:
            return f"{self.what}: {size_words(self.total_bytes)} ready"
        speed = f", {size_words(self.speed)}/s" if self.speed else ""
        eta = f", {duration_words(self.eta)} left" if self.eta is not None else ""
        return (f"downloading {self.what}: {size_words(self.done_bytes)} of {size_words(self.total_bytes)} "
                f"({100 * self.fraction:.0f}%){speed}{eta}")

    def as_dict(self) -> dict:
        return {"what": self.what, "done_bytes": self.done_bytes, "total_bytes": self.total_bytes,
                "speed_bytes_s": self.speed, "eta_s": self.eta, "finished": self.finished}


ProgressCallback = Callable[[DownloadProgress], None]


@dataclass(frozen=True)
class HubFile:
    path: str
    size: int
    etag: str      # the blob's name in huggingface_hub's cache: the LFS sha256, or the git blob id


@dataclass(frozen=True)
class DownloadPlan:
    """What a download fetches, and how much of it the cache already holds."""
    repo: str
    revision: str
    files: tuple[HubFile, ...]
    blobs: Path               # huggingface_hub's blob folder for the repo

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def bytes_finished(self) -> int:
        """The bytes of the files already in the cache (what a new run does not fetch again)."""
        return sum(f.size for f in self.files if (self.blobs / f.etag).exists())

    def bytes_on_disk(self) -> int:
        """Finished files whole, files being written (huggingface_hub's `<etag>.<id>.incomplete`) as far as they
        got: the progress of a running download."""
        return sum(self._file_bytes_on_disk(f) for f in self.files)

    def _file_bytes_on_disk(self, f: HubFile) -> int:
        if (self.blobs / f.etag).exists():
            return f.size
        partial = []
        for part in self.blobs.glob(f"{f.etag}*.incomplete"):
            try:
                partial.append(part.stat().st_size)
            except FileNotFoundError:  # renamed into the finished blob since the listing
                return f.size if (self.blobs / f.etag).exists() else 0
        return min(max(partial, default=0), f.size)

    @property
    def summary(self) -> str:
        by_folder: dict[str, int] = {}
        for f in self.files:
            folder = f.path.split("/")[0] if "/" in f.path else f.path
            by_folder[folder] = by_folder.get(folder, 0) + f.size
        parts = ", ".join(f"{name} {size_words(size)}" for name, size in sorted(by_folder.items()))
        files = "1 file" if len(self.files) == 1 else f"{len(self.files)} files"
        return f"{self.repo}: {size_words(self.total_bytes)} in {files} ({parts})"


# ---- models ----

def model_folder(reference: str, on_progress: ProgressCallback | None = None, on_plan=None) -> Path:
    """The local folder of a model repo ("owner/name", "hf:owner/name" or "modelscope:owner/name"), downloaded
    first if the cache does not hold it. `on_plan` gets the DownloadPlan before anything is fetched."""
    if reference.startswith(MODELSCOPE_PREFIX):
        return _modelscope_folder(reference.removeprefix(MODELSCOPE_PREFIX), on_progress)
    return hub_snapshot(reference.removeprefix("hf:"), MODEL_PATTERNS, on_progress, on_plan)


def hub_snapshot(repo: str, patterns, on_progress: ProgressCallback | None = None, on_plan=None,
                 revision: str = "main", max_bytes: int | None = None) -> Path:
    """huggingface_hub's snapshot of the files of `repo` that match `patterns`, fetched with announced size, a disk
    check and progress, or taken from the cache when offline. More than `max_bytes` is refused before it starts."""
    from huggingface_hub import snapshot_download
    if hub_offline():
        return _cached_snapshot(repo, patterns, revision, "HF_HUB_OFFLINE is set")
    try:
        plan = plan_download(repo, patterns, revision)
    except _network_errors() as error:
        return _cached_snapshot(repo, patterns, revision, f"the Hub cannot be reached ({type(error).__name__})")
    if max_bytes is not None and plan.total_bytes > max_bytes:
        raise DownloadError(f"{plan.summary}: more than the {size_words(max_bytes)} allowed here")
    if on_plan is not None:
        on_plan(plan)
    check_disk_space(plan)
    try:
        with ProgressWatcher(plan, on_progress):
            folder = snapshot_download(repo, revision=revision, allow_patterns=list(patterns), cache_dir=hub_cache(),
                                       tqdm_class=_silent_tqdm())
    except _network_errors() as error:
        raise DownloadError(f"the download of {repo} stopped ({type(error).__name__}: {error}); "
                            f"the finished files ({size_words(plan.bytes_finished())} of {size_words(plan.total_bytes)}) are "
                            f"kept in {hub_cache()}: run again to fetch the rest") from error
    return Path(folder)


def check_reachable(reference: str) -> None:
    """Raises DownloadError when a model repo can neither be downloaded now nor loaded from a complete copy in the
    cache (HF_HUB_OFFLINE set, or the Hub unreachable), or is not on the Hub: the page's model picker says so when
    the model is picked, not at the first run. ModelScope is checked when it downloads."""
    if reference.startswith(MODELSCOPE_PREFIX):
        return
    repo = reference.removeprefix("hf:")
    if hub_offline():
        _cached_snapshot(repo, MODEL_PATTERNS, "main", "HF_HUB_OFFLINE is set")
        return
    try:
        plan_download(repo, MODEL_PATTERNS)
    except _network_errors() as error:
        _cached_snapshot(repo, MODEL_PATTERNS, "main", f"the Hub cannot be reached ({type(error).__name__})")


def model_download_words(reference: str) -> str:
    """Before anything is fetched: how much a model repo weighs, how much of it the cache holds and whether the rest
    fits on the disk (markdown for the page)."""
    if reference.startswith(MODELSCOPE_PREFIX):
        return (f"{reference}: downloaded from ModelScope on the first run (its size and the free disk space are "
                "checked then)")
    repo = reference.removeprefix("hf:")
    if hub_offline():
        return f"{repo}: HF_HUB_OFFLINE is set, so only a complete copy in the cache at {hub_cache()} can load"
    try:
        plan = plan_download(repo, MODEL_PATTERNS)
    except _network_errors() as error:
        return (f"{repo}: the Hub cannot be reached ({type(error).__name__}); only a complete copy in the cache at "
                f"{hub_cache()} can load")
    except DownloadError as error:
        return f"⚠️ {error}"
    missing = plan.total_bytes - plan.bytes_finished()
    if missing <= 0:
        return f"{plan.summary}: in the cache, nothing to download"
    try:
        check_disk_space(plan)
    except DownloadError as error:
        return f"⚠️ {error}"
    return (f"⬇ {plan.summary}: {size_words(missing)} still to download ({size_words(free_bytes(plan.blobs))} free "
            f"at {nearest_existing(plan.blobs)}); it downloads on the first run, with progress")


def lora_download_words(reference: str) -> str:
    """Before a LoRA on the Hub is fetched: its size, or that the cache holds it."""
    found = parse_file_reference(reference)
    if found.filename is None or hub_offline():
        return f"{reference}: fetched from the Hub"
    try:
        plan = plan_download(found.repo, (found.filename,), found.revision)
    except _network_errors() as error:
        return f"{reference}: the Hub cannot be reached ({type(error).__name__}); only the cache can serve it"
    except DownloadError as error:
        return f"⚠️ {error}"
    missing = plan.total_bytes - plan.bytes_finished()
    if missing <= 0:
        return f"{found.filename} ({size_words(plan.total_bytes)}) is in the cache: no download"
    return f"needs a download of {size_words(missing)} from {found.repo} ({found.filename})"


def plan_download(repo: str, patterns, revision: str = "main") -> DownloadPlan:
    """The files to fetch (from the Hub's listing, with sizes) and where their blobs go."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError
    from huggingface_hub.file_download import repo_folder_name
    from huggingface_hub.hf_api import RepoFile
    api = HfApi()
    try:
        # one plain request first: with the Hub unreachable it fails at once (the listing retries for ~20 s)
        commit = api.repo_info(repo, revision=revision, timeout=10).sha
        entries = api.list_repo_tree(repo, recursive=True, revision=commit)
        files = tuple(HubFile(e.path, e.size, e.lfs.sha256 if e.lfs is not None else e.blob_id)
                      for e in entries if isinstance(e, RepoFile) and _matches(e.path, patterns))
    except (RepositoryNotFoundError, RevisionNotFoundError) as error:
        raise DownloadError(f"{repo} (revision {revision}) is not on the Hub, or is private or gated: "
                            f"{type(error).__name__}") from error
    if not files:
        raise DownloadError(f"{repo} has none of the files GhostEdit needs ({', '.join(patterns)})")
    blobs = hub_cache() / repo_folder_name(repo_id=repo, repo_type="model") / "blobs"
    return DownloadPlan(repo, revision, files, blobs)


def check_disk_space(plan: DownloadPlan) -> None:
    needed = plan.total_bytes - plan.bytes_finished()
    if needed <= 0:
        return
    free = free_bytes(plan.blobs)
    if free < needed + DISK_MARGIN_BYTES:
        raise DownloadError(
            f"not enough disk space for {plan.repo}: {size_words(needed)} still to download (of "
            f"{size_words(plan.total_bytes)}) and {size_words(DISK_MARGIN_BYTES)} to spare, but {nearest_existing(plan.blobs)} "
            f"has {size_words(free)} free. Free some space, or point HF_HUB_CACHE at a larger disk.")


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(nearest_existing(path)).free


def nearest_existing(path: Path) -> Path:
    path = Path(path).absolute()
    while not path.exists():
        path = path.parent
    return path


def hub_cache() -> Path:
    """huggingface_hub's cache folder (HF_HUB_CACHE, HF_HOME), read now so that a change of it takes effect."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    from huggingface_hub import constants
    return Path(constants.HF_HUB_CACHE)


def hub_offline() -> bool:
    from huggingface_hub import constants
    return constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def _cached_snapshot(repo: str, patterns, revision: str, why: str) -> Path:
    """The cached snapshot when no download can happen; huggingface_hub checks it against the file listing it
    saved when it downloaded, so a snapshot cut short is refused, never loaded half."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError
    try:
        return Path(snapshot_download(repo, revision=revision, allow_patterns=list(patterns), cache_dir=hub_cache(),
                                      local_files_only=True))
    except LocalEntryNotFoundError as error:
        raise DownloadError(f"{repo} cannot be downloaded now ({why}) and the cache at {hub_cache()} has no complete "
                            f"copy of it: {str(error).splitlines()[0]}") from error


def _matches(path: str, patterns) -> bool:
    return any(fnmatch.fnmatch(path, pattern) for pattern in patterns)


def _network_errors() -> tuple[type[BaseException], ...]:
    import httpx2
    from huggingface_hub.errors import OfflineModeIsEnabled
    return httpx2.TransportError, OfflineModeIsEnabled, ConnectionError


def _silent_tqdm():
    """huggingface_hub's own bars, drawn nowhere: GhostEdit shows one progress line of its own, measured on disk."""
    from tqdm.auto import tqdm

    class SilentTqdm(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["file"] = open(os.devnull, "w")  # noqa: SIM115 - closed with the bar
            super().__init__(*args, **kwargs)

        def close(self):
            file = self.fp
            super().close()
            file.close()
    return SilentTqdm


# ---- progress ----

class ProgressWatcher:
    """Polls the bytes in the cache while a download runs and reports DownloadProgress to `on_progress`: at the
    start, every POLL_SECONDS while bytes arrive, and once finished."""

    def __init__(self, plan: DownloadPlan, on_progress: ProgressCallback | None, measure=None):
        self.plan = plan
        self.on_progress = on_progress
        self.measure = measure or plan.bytes_on_disk
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="ghostedit-download-progress", daemon=True)
        self._window: deque[tuple[float, int]] = deque()

    def __enter__(self):
        if self.on_progress is not None:
            self._report(self.measure())
            self._thread.start()
        return self

    def __exit__(self, exc_type, exc, traceback):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.on_progress is not None and exc_type is None:
            self.on_progress(DownloadProgress(self.plan.repo, self.plan.total_bytes, self.plan.total_bytes, None, 0.0,
                                              finished=True))
        return False

    def _watch(self):
        last = None
        while not self._stop.wait(POLL_SECONDS):
            done = self.measure()
            if done != last:
                self._report(done)
                last = done

    def _report(self, done: int) -> None:
        now = time.monotonic()
        self._window.append((now, done))
        while len(self._window) > 2 and now - self._window[0][0] > SPEED_WINDOW_SECONDS:
            self._window.popleft()
        (start, start_done) = self._window[0]
        speed = (done - start_done) / (now - start) if now > start and done > start_done else None
        total = self.plan.total_bytes
        eta = (total - done) / speed if speed else None
        self.on_progress(DownloadProgress(self.plan.repo, min(done, total), total, speed, eta))


# ---- LoRA files ----

@dataclass(frozen=True)
class HubFileReference:
    repo: str
    filename: str | None     # None: the repo's one .safetensors file
    revision: str = "main"


def parse_file_reference(text: str) -> HubFileReference:
    """"owner/name", "owner/name:path/in/repo.safetensors", or a Hub URL (…/owner/name/resolve|blob/REV/PATH)."""
    if text.startswith(("https://", "http://")):
        return _parse_hub_url(text)
    repo, _, filename = text.removeprefix("hf:").partition(":")
    if not REPO_ID.fullmatch(repo):
        raise DownloadError(f"{text!r} is neither a Hub repo id (owner/name[:file.safetensors]) nor a Hub URL")
    return HubFileReference(repo, filename or None)


def _parse_hub_url(url: str) -> HubFileReference:
    from huggingface_hub import constants
    parsed = urlparse(url)
    hub = urlparse(constants.ENDPOINT)
    if parsed.netloc not in (hub.netloc, "huggingface.co", "hf.co"):
        raise DownloadError(f"{url} is not on the Hugging Face Hub ({hub.netloc}): GhostEdit fetches LoRAs from the "
                            "Hub only; download other files yourself and upload them")
    parts = [unquote(p) for p in parsed.path.strip("/").split("/")]
    if len(parts) >= 5 and parts[2] in ("resolve", "blob"):
        return HubFileReference(f"{parts[0]}/{parts[1]}", "/".join(parts[4:]), parts[3])
    if len(parts) == 2:
        return HubFileReference(f"{parts[0]}/{parts[1]}", None)
    raise DownloadError(f"{url} names no file: use a link to a .safetensors file (…/resolve/main/FILE) or a repo")


def is_lora_reference(text: str) -> bool:
    """Whether a --lora value names a LoRA on the Hub rather than a local file: an existing path is always local, and
    so is a missing "folder/file.safetensors" (an error about the file beats a search of the Hub for it)."""
    if Path(text).expanduser().exists():
        return False
    if text.startswith(("https://", "http://", "hf:")):
        return True
    repo, colon, _ = text.partition(":")
    return bool(REPO_ID.fullmatch(repo)) and bool(colon or not text.lower().endswith(".safetensors"))


def lora_file(reference: str, on_progress: ProgressCallback | None = None) -> Path:
    """The local file of a LoRA on the Hub, downloaded first if needed: safetensors only (read by content before
    use; a pickle is never fetched). `on_progress` gets the DownloadPlan first, then DownloadProgress."""
    found = parse_file_reference(reference)
    filename = found.filename
    if filename is None:
        if hub_offline():
            raise DownloadError(f"{reference}: name the file (owner/name:FILE.safetensors) to use the cache offline")
        try:
            filename = _only_safetensors(found.repo, found.revision)
        except _network_errors() as error:
            raise DownloadError(f"{reference}: the Hub cannot be reached ({type(error).__name__}) to find which file "
                                "to fetch; name it as owner/name:FILE.safetensors to use the cache") from error
    if not filename.endswith(".safetensors"):
        raise DownloadError(f"{filename} in {found.repo} is not a .safetensors file: only safetensors LoRAs are "
                            "fetched (other formats can run code when loaded)")
    path = hub_snapshot(found.repo, (filename,), on_progress, on_plan=on_progress, revision=found.revision,
                        max_bytes=MAX_LORA_BYTES) / filename
    check_lora_file(path, display_name=reference)
    return path


def _only_safetensors(repo: str, revision: str) -> str:
    from huggingface_hub import HfApi
    names = sorted(f for f in HfApi().list_repo_files(repo, revision=revision) if f.endswith(".safetensors"))
    if len(names) != 1:
        listed = ", ".join(names[:8]) + ("…" if len(names) > 8 else "")
        raise DownloadError(f"{repo} has {len(names)} .safetensors files ({listed or 'none'}): name one as "
                            f"{repo}:FILE")
    return names[0]


# ---- ModelScope ----

def _modelscope_folder(repo: str, on_progress: ProgressCallback | None) -> Path:
    try:
        from modelscope import snapshot_download
        from modelscope.hub.api import HubApi
    except ImportError:
        raise DownloadError(f"modelscope:{repo} needs the modelscope package: pip install modelscope") from None
    cache = hub_cache().parent / "modelscope"
    listing = HubApi().get_model_files(repo, recursive=True)
    files = tuple(HubFile(f["Path"], int(f.get("Size") or 0), f["Path"]) for f in listing
                  if f.get("Type") != "tree" and _matches(f["Path"], MODEL_PATTERNS))
    if not files:
        raise DownloadError(f"modelscope:{repo} has none of the files GhostEdit needs ({', '.join(MODEL_PATTERNS)})")
    plan = DownloadPlan(f"modelscope:{repo}", "master", files, cache / repo)
    check_disk_space(plan)
    with ProgressWatcher(plan, on_progress, measure=lambda: _folder_bytes(cache)):
        return Path(snapshot_download(repo, cache_dir=str(cache), allow_patterns=list(MODEL_PATTERNS)))


def _folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file()) if Path(folder).exists() else 0


# ---- words ----

def size_words(size: float | None) -> str:
    if size is None:
        return "–"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(size) < 1000:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} TB"


def duration_words(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def printer(interval_seconds: float = 1.0, print_line=print) -> Callable:
    """A progress callback for a terminal: the plan, then a line at most every `interval_seconds`, and the end."""
    last = [float("-inf")]

    def show(item) -> None:
        if isinstance(item, DownloadPlan):
            print_line(f"  [download] {item.summary}", flush=True)
            return
        now = time.monotonic()
        if item.finished or now - last[0] >= interval_seconds:
            last[0] = now
            print_line(f"  [download] {item.words}", flush=True)
    return show
