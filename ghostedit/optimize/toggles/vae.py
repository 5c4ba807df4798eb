"""Toggle `vae`: how the VAE encodes the condition images and decodes the edit. `image`: its causal 3-D convolutions
as 2-D ones on the lone frame of an image, channels-last (optimize/vae_frames.py): the same function without the
zero frames of the causal padding. `image-fused`: that, and each RMS norm with the SiLU after it in one Triton kernel
of GhostEdit's, which also adds the bias of the residual block's convolution before it (and one more kernel the
block's last bias and its residual), the upsampling in the VAE's dtype: the same function, rounded where the released
kernels round. The VAE is shared by every configuration, so the choice is set for the run and put back after it.
Qwen-Image-2.1's RGBA VAE runs a lone frame as 2-D convolutions already (`image` has nothing to do there); its norms,
residual blocks and upsampling are the Edit VAE's, and `image-fused` runs them in the same kernels, its convolutions
channels-last."""
import contextlib

from ...device import Availability, needs_cuda
from .. import vae_frames
from ...models.family import QWEN_IMAGE_21_DIT
from ..registry import RUN, Choice, RunContext, Toggle, register


@contextlib.contextmanager
def _vae(context: RunContext, choice: str):
    if choice == "video":
        yield
        return
    vae = context.prepared.pipe.vae
    with vae_frames.image_convolutions(vae) as count, \
            (vae_frames.fused_norms(vae) if choice == "image-fused" else contextlib.nullcontext()) as norms:
        convolutions = "2-D convolutions channels-last" if vae_frames.already_2d(vae) else \
            "causal convolutions as 2-D ones"
        words = f"{choice}: {count} {convolutions}"
        if norms is not None:
            words += (f", {norms} RMS norms in one kernel each (with the SiLU after them and the residual blocks' "
                      "convolution biases), upsampling in the VAE's dtype")
        context.ran.setdefault("words", {})["vae"] = words
        yield


def _availability(choice: str, device: str) -> Availability:
    return needs_cuda(device, "vae image-fused (a Triton kernel)") if choice == "image-fused" else Availability.yes()


register(Toggle(
    name="vae", label="VAE",
    help="as released (a video VAE: 3-D convolutions over the frame and its zero-padded history), or as an image "
         "network (2-D convolutions, channels-last: the same function, a third of the convolutions' work), or that "
         "with each RMS norm and its SiLU in one kernel instead of eight passes over the image",
    choices=(Choice("video", "video (3-D convolutions, as DiffSynth runs it)"),
             Choice("image", "image (2-D convolutions on the one frame, channels-last)",
                    families={QWEN_IMAGE_21_DIT: "Qwen-Image-2.1's RGBA VAE (DiffSynth's QwenImage21VAE) already runs "
                                                 "a lone frame as 2-D convolutions: its QwenImage21CausalConv3d is an "
                                                 "nn.Conv2d, padded in height and width only"}),
             Choice("image-fused", "image, norms fused (one kernel per RMS norm and its SiLU)")),
    default="video", changes=RUN, component="vae", order=97, run_context=_vae, availability=_availability,
    families={},
))
