"""The best configuration's GPU-only code paths run on a CPU, for tests of their wiring (which kernel gets which
tensors, in which layout, with which scales): torchao's rowwise FP8 GEMM emulated (the FP8 values times their scales,
multiplied in float32), cuDNN's FP8 attention emulated (the FP8 inputs dequantized, SDPA in float32, the output cast
to FP8 scaled as v is), GhostEdit's Triton kernels in Triton's interpreter (TRITON_INTERPRET=1 must be set before
Triton is imported: in a process of its own). Their numerics are the GPU's to check (scripts/gpu/); what these
emulations show is that two paths that should compute the same values from the same kernels do."""
import contextlib

import torch

EMULATED = ("FP8 GEMMs and cuDNN's FP8 attention emulated on the CPU, GhostEdit's Triton kernels in Triton's "
            "interpreter")


def scaled_mm(a, b, scale_a=None, scale_b=None, bias=None, out_dtype=None, use_fast_accum=False, **_):
    """torch._scaled_mm with rowwise scales, which the CPU build does not take: (a * scale_a) @ (b * scale_b)."""
    out = (a.float() * scale_a) @ (b.float() * scale_b)
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


def cudnn_fp8_attention(q, k, v, q_descale, k_descale, v_descale):
    """cuDNN's FP8 op: FP8 parts joined along the sequence and descales in, the output in FP8 scaled as v is."""
    q, k, v = (torch.cat([part.float() for part in parts], dim=1).transpose(1, 2) for parts in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q * q_descale, k * k_descale, v * v_descale)
    return (out / v_descale).transpose(1, 2).to(torch.float8_e4m3fn)


@contextlib.contextmanager
def gpu_paths_on_the_cpu():
    """Inside, every toggle is available here and the GPU's FP8 kernels are emulated (see the module's words)."""
    import torchao.float8.inference as inference
    import torchao.quantization.quant_api as quant_api

    from ghostedit.device import Availability
    from ghostedit.kernels import fp8_attention
    from ghostedit.optimize import registry
    with contextlib.ExitStack() as stack:
        patch = stack.enter_context(_patching())
        patch(inference, "_check_hardware_support", lambda granularity: None)
        patch(quant_api, "_check_hardware_support", lambda granularity: None)
        patch(torch, "_scaled_mm", scaled_mm)
        patch(fp8_attention, "cudnn_fp8_attention", cudnn_fp8_attention)
        for toggle in registry.toggles():
            patch(toggle, "availability", lambda value, device: Availability.yes(), frozen=True)
        yield


@contextlib.contextmanager
def _patching():
    undo = []

    def patch(owner, name, value, frozen=False):
        undo.append((owner, name, getattr(owner, name), frozen))
        (object.__setattr__ if frozen else setattr)(owner, name, value)
    try:
        yield patch
    finally:
        for owner, name, value, frozen in reversed(undo):
            (object.__setattr__ if frozen else setattr)(owner, name, value)
