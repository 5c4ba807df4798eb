"""The dtype each model component runs in: what is fast on the device unless one dtype is asked for everywhere.

On a GPU everything runs in bf16. On a CPU the VAE's 3-D convolutions have no fast bf16 path (the tiny VAE at
256x256: 4.7 s to encode and 9-11 s to decode in bf16, 0.1 s and 0.2 s in float32, measured on 2 cores), and the
text encoder is a little faster in float32 too, while the DiT's linears are faster in bf16: each gets its own.
A component whose dtype differs from the pipeline's (the DiT's, which DiffSynth hands every tensor in) is wrapped so
that it takes and returns the pipeline's dtype.
"""
from __future__ import annotations

import torch

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
COMPONENTS = ("dit", "text_encoder", "vae")
CPU_FAST = {"dit": torch.bfloat16, "text_encoder": torch.float32, "vae": torch.float32}


def component_dtypes(device: str, dtype: str | None = None) -> dict[str, torch.dtype]:
    """`dtype` ("bfloat16" or "float32") for every component, or None: what is fast on `device`."""
    if dtype is not None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
        return dict.fromkeys(COMPONENTS, DTYPES[dtype])
    if device.startswith("cuda"):
        return dict.fromkeys(COMPONENTS, torch.bfloat16)
    return dict(CPU_FAST)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class CastingVAE(torch.nn.Module):
    """The VAE in its own dtype behind DiffSynth's encode/decode calls, which bring and expect the pipeline's."""

    def __init__(self, vae: torch.nn.Module, pipeline_dtype: torch.dtype):
        super().__init__()
        self.vae = vae
        self.pipeline_dtype = pipeline_dtype

    @property
    def dtype(self) -> torch.dtype:
        return next(self.vae.parameters()).dtype

    def encode(self, x, **kwargs):
        return self.vae.encode(x.to(self.dtype), **kwargs).to(self.pipeline_dtype)

    def encode_sample(self, x, noise):
        return self.vae.encode_sample(x.to(self.dtype), noise.to(self.dtype)).to(self.pipeline_dtype)

    def decode(self, x, **kwargs):
        return self.vae.decode(x.to(self.dtype), **kwargs).to(self.pipeline_dtype)


def apply_component_dtypes(pipe, dtypes: dict[str, torch.dtype]) -> None:
    """Casts each component of a loaded pipeline (whose pipeline dtype is the DiT's) to its dtype. The text
    encoder's outputs are cast by DiffSynth itself (prompt embeddings `.to(pipe.torch_dtype)`)."""
    pipe.text_encoder.to(dtypes["text_encoder"])
    if dtypes["vae"] != pipe.torch_dtype:
        pipe.vae = CastingVAE(pipe.vae.to(dtypes["vae"]), pipe.torch_dtype)
