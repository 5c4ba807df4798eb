"""Toggle `text-encoder`: how the text encoder (the Edit models' Qwen2.5-VL-7B, Qwen-Image-2.1's Qwen3-VL-8B) runs.
`compiled`: torch.compile of each of its decoder layers and vision blocks (regional, dynamic shapes), for a text
encoder that an H100 profile showed idle most of its stage while Python launched its small kernels one by one
(lab/LOG.md, section 6). The text encoder is shared by every configuration, so the compiled layers are set for the
run and put back after it; Dynamo keeps their code, so only the first run compiles (inside its text-encoding stage).
`joined-windows`: Qwen2.5-VL's vision tower's windowed attention in one call per block (optimize/vision_windows.py),
also set for the run only; Qwen3-VL's vision tower has no windows. `graphed`: each layer replayed from a CUDA graph
per shape (optimize/text_encoder_graphs.py), with Qwen2.5-VL's windows joined, the graphs kept with the text encoder.
The VAE is not compiled: DiffSynth's causal VAE carries its frame cache in Python lists that it changes in place,
which Dynamo cannot keep in one graph (its own toggle, `vae`, runs it as an image network instead)."""
import contextlib

from ... import tensors
from ...device import Availability, UnavailableOptionError, needs_cuda
from .. import compile as compile_blocks, text_encoder_graphs, vision_windows
from ...models.family import QWEN_IMAGE_21_DIT
from ..registry import RUN, Choice, RunContext, Toggle, register


STREAMED = "the text encoder is streamed from host memory layer by layer (memory mode low)"


def _on_device(text_encoder, device: str) -> bool:
    return all(held.type == device.split(":")[0] for held in tensors.devices(text_encoder))


@contextlib.contextmanager
def _text_encoder(context: RunContext, choice: str):
    if choice == "eager":
        yield
        return
    text_encoder = context.prepared.pipe.text_encoder
    streamed = not _on_device(text_encoder, context.device)
    windows = vision_windows.has_windows(text_encoder)
    if choice == "graphed" and not streamed:
        with _graphed(context, text_encoder, windows):
            yield
        return
    if choice in ("joined-windows", "graphed"):
        if choice == "graphed":  # streamed: as cuda-graph does for a streamed DiT, the run says so and runs without
            context.not_applied("text-encoder", f"graphs not applied on this run: {STREAMED}; "
                                                + ("its vision windows joined" if windows else "it runs eager"))
        with _windows_joined(text_encoder, windows):
            yield
        return
    if streamed:
        raise UnavailableOptionError(f"text-encoder compiled needs the text encoder on the device; here {STREAMED}")
    compile_blocks.configure_dynamo()
    layers = text_encoder_graphs.regions(text_encoder)
    if tensors.first_time(text_encoder, "compiled"):  # Dynamo keeps the compiled code for later runs
        context.recorder.telemetry.notes.append("text encoder compiled on this run: its text-encoding stage includes "
                                                "the compile, later runs reuse the code")
    for layer in layers:
        layer.compile(dynamic=True)
    try:
        yield
    finally:
        for layer in layers:
            layer._compiled_call_impl = None


def _windows_joined(text_encoder, windows: bool):
    """The vision windows joined where the vision tower has windows (Qwen2.5-VL), else nothing to do (Qwen3-VL)."""
    return vision_windows.joined_windows(text_encoder) if windows else contextlib.nullcontext()


@contextlib.contextmanager
def _graphed(context: RunContext, text_encoder, windows: bool):
    graphs = text_encoder_graphs.graphs_of(text_encoder)
    owner = (tensors.placement_mark(text_encoder), None)  # graphs read the weights where they lie: a move drops them
    with _windows_joined(text_encoder, windows), \
            graphs.running(owner, context.recorder), \
            text_encoder_graphs.graphed_layers(text_encoder, graphs):
        try:
            yield
        finally:
            context.ran.setdefault("words", {})["text-encoder"] = graphs.words()


def _availability(choice: str, device: str) -> Availability:
    if choice == "compiled":
        return compile_blocks.availability("regional", device)
    if choice == "graphed":
        return needs_cuda(device, "text-encoder graphed (CUDA graphs)")
    return Availability.yes()


register(Toggle(
    name="text-encoder", label="Text encoder",
    help="eager, each of its layers compiled with torch.compile (the first run compiles them), its vision "
         "tower's windowed attention in one call per block (the Edit models' Qwen2.5-VL), or each layer replayed "
         "from a CUDA graph, with those windows joined (a shape is captured in the edit that first brings it, and "
         "replayed from the next one on)",
    choices=(Choice("eager", "eager (as DiffSynth runs it)"),
             Choice("compiled", "compiled (torch.compile of each layer)"),
             Choice("joined-windows", "vision windows joined (one attention call per vision block)",
                    families={QWEN_IMAGE_21_DIT: "Qwen-Image-2.1's text encoder, Qwen3-VL, has no windowed attention "
                                                 "to join: each of its vision blocks attends over each image's "
                                                 "patches whole"}),
             Choice("graphed", "graphed (each layer replayed from a CUDA graph per shape, vision windows joined)")),
    default="eager", changes=RUN, component="text_encoder", order=96, run_context=_text_encoder,
    availability=_availability, families={},
))
