"""Mask and strength in the app: the parameters /edit, /edit_image (MCP) and /run_variants take for them, with
their descriptions and types, the values as EditRequest takes them, and the page's inputs, in an accordion of their
own: an image editor to paint the mask on the image to edit with a white brush, the mask itself (painted there or
uploaded), the strength, the crop margin and the paste-back switch.

The painted strokes reach the run as the mask component's file: each change in the editor writes the mask (white
where painted) to the upload folder and shows it, so the page sends what an API client sends, one mask file."""
from __future__ import annotations

import uuid
from pathlib import Path

import gradio as gr
from gradio.data_classes import FileData
from gradio.utils import get_upload_folder
from PIL import Image, ImageChops

from ..config import SIZE_RANGE
from .settings import uploaded_images

START_PARAMETERS = {
    "mask": "an inpainting mask for the image to edit (the first image): white = change, black = keep (in a file "
            "with transparency: transparent = change, as OpenAI's images API has it), of that image's aspect ratio. "
            "The edit starts from the image and keeps it outside the mask; without width and height the output "
            "takes that image's aspect ratio (default: no mask)",
    "strength": "how much of the image to edit to redo, above 0 to 1: the edit starts from it noised to that point "
                "and runs that share of the steps (default 1: from noise, a plain edit)",
    "padding_mask_crop": "with a mask: edit only the box around the mask widened by this many pixels, at the full "
                         f"output size, then lay it over the image (0 to {SIZE_RANGE[1]}; default none: no crop)",
    "paste_back": "with a mask: the image's own pixels outside the mask, exactly (default false)",
}


def start_types() -> dict[str, tuple[object, object]]:
    """{API parameter: (type hint, default)} for the typed endpoints (api.parameter_types)."""
    return {"mask": (FileData | None, None), "strength": (float, 1.0), "padding_mask_crop": (int | None, None),
            "paste_back": (bool, False)}


def start_values(values: dict, upload_folder: Path) -> dict:
    """EditRequest's mask, strength, padding_mask_crop and paste_back from the endpoint's values as sent (the mask a
    file in the upload folder or a data URL, unopened: EditRequest reads and checks it)."""
    mask = uploaded_images([values.get("mask")], upload_folder)
    return {"mask": mask[0] if mask else None,
            "strength": 1.0 if values.get("strength") is None else values["strength"],
            "padding_mask_crop": values.get("padding_mask_crop"),
            "paste_back": False if values.get("paste_back") is None else values["paste_back"]}


def start_words(request) -> str:
    """How the edit started from its first image, for the run summary's first line; nothing for a plain edit."""
    start = request.start_settings()
    if not start:
        return ""
    words = [f"strength {start['strength']:g}"]
    if start["mask"]:
        words.append("masked")
    if start["padding_mask_crop"] is not None:
        words.append(f"crop margin {start['padding_mask_crop']} px")
    if start["paste_back"]:
        words.append("pasted back")
    return " · " + ", ".join(words)


def add_mask_inputs(ui) -> None:
    """The accordion "Mask and strength" (inside the Blocks, after ui.image exists): sets ui.mask_editor, ui.mask,
    ui.strength, ui.padding_mask_crop, ui.paste_back and ui.start (the endpoint inputs, in START_PARAMETERS'
    order), and wires the editor to the image to edit and to the mask."""
    with gr.Accordion("Mask and strength (optional)", open=False, elem_id="mask_and_strength"):
        ui.mask_editor = gr.ImageEditor(
            label="Paint what may change (white brush) on the image to edit", type="pil", sources=(),
            transforms=(), layers=False, elem_id="mask_editor", height=320,
            brush=gr.Brush(colors=["#ffffff"], default_color="#ffffff", color_mode="fixed"))
        with gr.Row(equal_height=False):
            ui.mask = gr.Image(label="Mask (white = change): painted above, or upload one", type="filepath",
                               sources=["upload", "clipboard"], height=160, elem_id="mask")
            with gr.Column():
                ui.strength = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Strength", elem_id="strength",
                                        info="1: from noise (a plain edit); lower keeps more of the image and runs "
                                             "that share of the steps")
                ui.padding_mask_crop = gr.Number(None, precision=0, minimum=0, maximum=SIZE_RANGE[1],
                                                 label="Crop around the mask: margin in pixels",
                                                 elem_id="padding_mask_crop",
                                                 info="empty: no crop; else the model edits that box at full size")
                ui.paste_back = gr.Checkbox(False, label="Paste the image back outside the mask",
                                            elem_id="paste_back", info="its own pixels, exactly, where the mask is black")
    ui.start = [ui.mask, ui.strength, ui.padding_mask_crop, ui.paste_back]
    private = dict(api_visibility="private", concurrency_limit=None, show_progress="hidden")
    ui.image.change(editor_background, ui.image, [ui.mask_editor, ui.mask], **private)
    ui.mask_editor.input(painted_mask, ui.mask_editor, ui.mask, trigger_mode="always_last", **private)


def editor_background(image: str | None):
    """The image to edit as the editor's background, unpainted; the mask of another image cleared."""
    if image is None:
        return None, None
    return {"background": image, "layers": [], "composite": image}, None


def painted_mask(value: dict | None) -> str | None:
    """The editor's strokes as a mask file (white where painted, grey at their soft edges), of the background's
    size; None where nothing is painted."""
    if not value or value.get("background") is None:
        return None
    alphas = [layer.convert("RGBA").getchannel("A") for layer in value.get("layers") or [] if layer is not None]
    if not alphas or max(alpha.getextrema()[1] for alpha in alphas) == 0:
        return None
    mask = alphas[0]
    for alpha in alphas[1:]:
        mask = ImageChops.lighter(mask, alpha.resize(mask.size))
    if mask.size != value["background"].size:
        mask = mask.resize(value["background"].size, Image.LANCZOS)
    path = Path(get_upload_folder()) / "masks" / f"{uuid.uuid4().hex}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    mask.save(path)
    return str(path)

