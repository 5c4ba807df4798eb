"""Toggle `prefix-cache`: Qwen-Image-2.1's prefix key/value cache (models/qwen_image_21/dit.py). The text and
reference tokens are modulated as at t=0, so their keys and values are the same at every step: the first step
computes every token and keeps them, later steps compute the target's tokens alone (the run's telemetry counts the
tokens each DiT forward computed: `dit_tokens`). Lossless in exact arithmetic; in bf16 the cached steps attend in
another layout than the first, so the image differs from one without the cache in its rounding (as diffusers says
of its own cache). It changes how a run goes, not the prepared DiT."""
from ...models.family import QWEN_IMAGE_DIT
from ..registry import OFF, ON, RUN, Choice, Toggle, register

register(Toggle(
    name="prefix-cache", label="Prefix KV cache (Qwen-Image-2.1)",
    help="the text and reference images' keys and values computed at the first step and reused after it: later "
         "steps compute the target image's tokens alone",
    choices=(Choice(ON, "on (the target's tokens alone after the first step)"),
             Choice(OFF, "off (every token at every step)")),
    default=ON, changes=RUN, order=97, tag=lambda value: f"prefix-cache-{value}",
    families={QWEN_IMAGE_DIT: "the Edit DiT modulates its text and image streams at the step's t: no token's keys "
                              "stay the same from step to step"},
))
