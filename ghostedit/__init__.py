"""GhostEdit: instruction-based image editing with Qwen-Image-Edit on DiffSynth, with every speed toggle measured."""
from .config import EditRequest, LoraChoice, OptimizationConfig

__all__ = ["EditRequest", "LoraChoice", "OptimizationConfig"]
