"""Toggle `vae`: how the VAE encodes the condition images and decodes the edit. `image`: its causal 3-D convolutions
as 2-D ones on the lone frame of an image, channels-last (optimize/vae_frames.py): the same function without the
zero frames of the causal padding. The VAE is shared by every configuration, so the choice is set for the run and
put back after it."""
import contextlib

from .. import vae_frames
from ..registry import RUN, Choice, RunContext, Toggle, register


@contextlib.contextmanager
def _vae(context: RunContext, choice: str):
    if choice == "video":
        yield
        return
    with vae_frames.image_convolutions(context.prepared.pipe.vae) as count:
        context.ran.setdefault("words", {})["vae"] = f"image: {count} causal convolutions as 2-D ones"
        yield


register(Toggle(
    name="vae", label="VAE",
    help="as released (a video VAE: 3-D convolutions over the frame and its zero-padded history), or as an image "
         "network (2-D convolutions, channels-last: the same function, a third of the convolutions' work)",
    choices=(Choice("video", "video (3-D convolutions, as DiffSynth runs it)"),
             Choice("image", "image (2-D convolutions on the one frame, channels-last)")),
    default="video", changes=RUN, component="vae", order=97, run_context=_vae,
))
