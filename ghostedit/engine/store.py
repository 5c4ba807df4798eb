"""The model store: the base weights of one model source, loaded once and placed where the memory mode says
(placement.py): on the GPU, in pinned host memory, or in pinned host memory streamed to the GPU while the component
runs. A change of mode moves the components; the engine drops the prepared pipelines first. Once loaded, the
objects alive (the base modules among them) are frozen out of the cycle collector's full walks until unload."""
from __future__ import annotations

import gc

import torch

from ..device import empty_cache
from ..models import ModelSpec
from ..pinned import PinnedArena, pin_module
from ..tensors import storage_bytes, storage_pointers
from . import placement as placements


class ModelStore:
    def __init__(self, spec: ModelSpec, device: str, dtypes: dict[str, torch.dtype], dit_only: bool = False):
        """`dit_only`: the DiT alone (the DiT-level bench)."""
        self.spec, self.device, self.dtypes, self.dit_only = spec, device, dtypes, dit_only
        self.pipe = None
        self.placement: placements.Placement | None = None
        self.load_count = 0
        self._streamed_state = None   # the text encoder's pinned weights while it is streamed
        self.base_pointers: set[int] = set()  # the base DiT's storages, listed whenever they change
        self._loaded_sizes: placements.Sizes | None = None  # counted once loaded: base weights are never rewritten

    def sizes(self) -> placements.Sizes:
        """Bytes of each component: measured once loaded, the model's nominal sizes before."""
        if self._loaded_sizes is not None:
            return self._loaded_sizes
        sizes = self.spec.nominal_sizes(self.dtypes)
        return placements.Sizes(sizes.dit, 0, 0) if self.dit_only else sizes

    def _count_loaded(self) -> None:
        """The loaded components' bytes, counted before any is streamed (every run's check reads them: counting
        thousands of tensors each time cost an edit milliseconds)."""
        self._loaded_sizes = placements.Sizes(*(storage_bytes(module) if (module := getattr(self.pipe, name))
                                                is not None else 0 for name in ("dit", "text_encoder", "vae")))

    def plan(self, mode: str) -> placements.Placement:
        """Where the components would live in `mode` (placed already if it is the current one)."""
        if self.placement is not None and self.placement.mode == mode:
            return self.placement
        return placements.decide(mode, self.device, self.sizes())

    def load(self, mode: str, recorder) -> object:
        """The base pipeline, loaded on first use straight into its placement."""
        if self.pipe is None:
            # imported by Engine (import_run_code), not at the top: the app's page is served without DiffSynth
            from ..models import loading
            wanted = self.plan(mode)
            with recorder.stage("load", f"loading {self.spec.description}"):
                self.pipe = loading.load_base_pipeline(
                    self.spec, self.device, self.dtypes, base_dit_on_gpu=wanted.base_on_gpu, dit_only=self.dit_only,
                    text_encoder_on_gpu=wanted.where["text_encoder"] in (placements.GPU, placements.CPU),
                    on_download=recorder.download_progress)
                self._count_loaded()
                self.placement = placements.decide(mode, self.device, self.sizes())
                self._apply(self.placement, previous=None)
                self.base_pointers = storage_pointers(self.pipe.dit)
                _freeze_what_lives()  # a full collection: a quarter second on the tiny model, part of loading
            self.load_count += 1
        return self.pipe

    def unload(self) -> None:
        """Drops the base pipeline and gives its memory back. Frozen objects are never collected, so they are
        unfrozen first: the modules' reference cycles would otherwise keep the weights alive."""
        self.pipe, self.placement, self._streamed_state = None, None, None
        self.base_pointers = set()
        gc.unfreeze()
        gc.collect()
        empty_cache(self.device)

    def replace(self, mode: str) -> bool:
        """Moves the loaded components to the placement of `mode`; returns whether anything moved."""
        wanted = self.plan(mode)
        if self.pipe is None or wanted == self.placement:
            return False
        previous, self.placement = self.placement, wanted
        self._apply(wanted, previous)
        self.base_pointers = storage_pointers(self.pipe.dit)
        return True

    def _apply(self, wanted: placements.Placement, previous: placements.Placement | None) -> None:
        """Moves what `previous` placed elsewhere; right after loading (no `previous`) everything is where `wanted`
        says, and only the text encoder's streaming is left to set up."""
        if wanted.chosen == "cpu":
            return
        streams = wanted.where["text_encoder"] == placements.STREAMED
        streamed = previous is not None and previous.where["text_encoder"] == placements.STREAMED
        if previous is not None and wanted.where["dit"] != previous.where["dit"]:
            _move(self.pipe.dit, self.device if wanted.base_on_gpu else "pinned")
        if self.pipe.text_encoder is not None and streams and not streamed:
            self._stream_text_encoder()
        elif self.pipe.text_encoder is not None and streamed and not streams:
            self._unstream_text_encoder()
        empty_cache(self.device)

    def _stream_text_encoder(self) -> None:
        """accelerate's cpu_offload: the weights stay in pinned host memory and each submodule's are brought to the
        GPU for its own forward."""
        from accelerate import cpu_offload
        encoder = self.pipe.text_encoder
        arena = PinnedArena()
        self._streamed_state = {name: arena.copy(tensor.detach()) for name, tensor in encoder.state_dict().items()}
        cpu_offload(encoder, execution_device=torch.device(self.device), state_dict=self._streamed_state)

    def _unstream_text_encoder(self) -> None:
        from accelerate.hooks import remove_hook_from_module
        from accelerate.utils import set_module_tensor_to_device
        encoder = self.pipe.text_encoder
        remove_hook_from_module(encoder, recurse=True)
        for name, tensor in self._streamed_state.items():
            set_module_tensor_to_device(encoder, name, self.device, value=tensor)
        self._streamed_state = None


def _freeze_what_lives() -> None:
    """Leaves every object alive now (torch, the base modules: hundreds of thousands) out of later collections: a
    full collection walks them all, and the first forward's compile, which allocates many objects, set off several
    (the garbage collector's A/B, lab/LOG.md section 2). Garbage is collected first so that none is frozen."""
    gc.collect()
    gc.freeze()


def _move(module: torch.nn.Module, where: str) -> None:
    """Every parameter and buffer of `module` to a device, or to pinned host memory (fast copies to the GPU), one
    tensor at a time so that only one extra copy exists at any moment."""
    if where == "pinned":
        pin_module(module, end_to_end=module.joinable_parts())
        return
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            tensor.data = tensor.data.to(where)
