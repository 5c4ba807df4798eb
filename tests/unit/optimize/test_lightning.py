"""Lightning presets: the lightx2v LoRA that matches each model (its real repo and file names; Qwen-Image-2.1's
one 4-step LoRA and its schedule), the model told apart by its own configs, the preset parsed into the Lightning
schedule with its LoRA (downloaded from a fake Hub with progress) stacked with a style LoRA, an edit on the tiny
model with that stack (and a 2.1 one on the tiny 2.1), and the refusals."""
import numpy as np
import pytest
import safetensors.torch

from ghostedit import cli
from ghostedit.config import OptimizationConfig
from ghostedit.errors import InvalidRequestError
from ghostedit.models.tiny import ensure_tiny_lora, tiny_lora_state_dict
from ghostedit.models.family import QWEN_IMAGE_EDIT, QWEN_IMAGE_EDIT_2509, QWEN_IMAGE_EDIT_2511
from ghostedit.optimize.presets import LIGHTNING, PresetError, model_family
from tests.fake_hub import Repo, hub_serving
from tests.reference_checkpoints import write_configs

EDIT_2509_4 = "Qwen-Image-Edit-2509/Qwen-Image-Edit-2509-Lightning-4steps-V1.0-bf16.safetensors"
EDIT_2511_8 = "Qwen-Image-Edit-2511-Lightning-8steps-V1.0-bf16.safetensors"


def test_each_model_gets_its_own_lightning_lora():
    four, eight = LIGHTNING["lightning-4"], LIGHTNING["lightning-8"]
    assert (four.steps, four.cfg_scale, eight.steps) == (4, 1.0, 8)
    assert four.lora_reference(QWEN_IMAGE_EDIT_2509) == f"lightx2v/Qwen-Image-Lightning:{EDIT_2509_4}"
    assert eight.lora_reference(QWEN_IMAGE_EDIT_2511) == f"lightx2v/Qwen-Image-Edit-2511-Lightning:{EDIT_2511_8}"
    assert eight.lora_reference(QWEN_IMAGE_EDIT) == \
        "lightx2v/Qwen-Image-Lightning:Qwen-Image-Edit-Lightning-8steps-V1.0-bf16.safetensors"


@pytest.mark.parametrize("repo, family", [
    ("Qwen-Image-Edit", QWEN_IMAGE_EDIT), ("Qwen-Image-Edit-2509", QWEN_IMAGE_EDIT_2509),
    ("Qwen-Image-Edit-2511", QWEN_IMAGE_EDIT_2511)])
def test_a_folder_is_told_apart_by_its_configs_not_its_name(tmp_path, repo, family):
    folder = write_configs(tmp_path / "Qwen-Image-Edit-2509", repo)  # the name lies on purpose
    assert model_family(str(folder)) == family


def test_models_without_a_lightning_lora_are_refused(tmp_path):
    assert model_family("Qwen/Qwen-Image-Edit-2511") == QWEN_IMAGE_EDIT_2511
    assert model_family("modelscope:Qwen/Qwen-Image-Edit") == QWEN_IMAGE_EDIT
    with pytest.raises(PresetError, match="tiny model has random weights and no Lightning LoRA"):
        model_family("tiny")
    write_configs(tmp_path, "Qwen-Image-Edit-2509", pipeline_class="QwenImagePipeline")
    with pytest.raises(PresetError, match="names 'QwenImagePipeline'.*no Lightning LoRA is known for it"):
        model_family(str(tmp_path))
    with pytest.raises(InvalidRequestError, match="lightning-4 picks the Lightning LoRA made for the model"):
        OptimizationConfig.parse("lightning-4")


@pytest.fixture
def lightning_hub(tmp_path, monkeypatch):
    """lightx2v's two repos on a fake Hub, each file a LoRA keyed for the tiny DiT (no real weights here)."""
    lora = safetensors.torch.save(tiny_lora_state_dict("peft"))
    repos = {"lightx2v/Qwen-Image-Lightning": Repo({EDIT_2509_4: lora, "README.md": b"x"}),
             "lightx2v/Qwen-Image-Edit-2511-Lightning": Repo({EDIT_2511_8: lora})}
    with hub_serving(repos, tmp_path / "hf-cache", monkeypatch) as hub:
        yield hub


def test_preset_downloads_its_lora_sets_the_schedule_and_stacks_with_a_style_lora(lightning_hub, tmp_path):
    from ghostedit.downloads import lora_download_words
    reference = LIGHTNING["lightning-8"].lora_reference(model_family("Qwen/Qwen-Image-Edit-2511"))
    assert lora_download_words(reference) == (f"needs a download of 42.2 KB from "
                                              f"lightx2v/Qwen-Image-Edit-2511-Lightning ({EDIT_2511_8})")
    style = ensure_tiny_lora("kohya", tmp_path)
    events = []
    config = OptimizationConfig.parse(f"lightning-8,lora={style}:0.5", model="Qwen/Qwen-Image-Edit-2511",
                                      on_download=events.append)
    assert config.value("scheduler") == "lightning"
    lightning, styled = config.loras
    assert lightning.path.endswith(EDIT_2511_8) and lightning.scale == 1.0
    assert styled.path == str(style) and styled.scale == 0.5
    assert events and events[-1].finished and events[-1].total_bytes == len(
        lightning_hub.repos["lightx2v/Qwen-Image-Edit-2511-Lightning"].files[EDIT_2511_8])
    assert len(lightning_hub.downloads(EDIT_2511_8)) == 1
    OptimizationConfig.parse("lightning-8", model="Qwen/Qwen-Image-Edit-2511")  # from the cache now
    assert len(lightning_hub.downloads(EDIT_2511_8)) == 1
    assert "is in the cache: no download" in lora_download_words(reference)


def test_preset_arguments_run_the_lightning_stack_on_the_tiny_engine(lightning_hub, tmp_path, capsys):
    """`edit --preset lightning-4 --lora STYLE:0.5` as the CLI applies it for a 2509 model, run on the tiny engine
    (the tiny model has no Lightning LoRA of its own; the fake Hub's file is keyed for the tiny DiT): the LoRA is
    fetched with printed progress, the run has 4 steps at CFG 1 on the Lightning schedule with both LoRAs fused."""
    from PIL import Image

    from ghostedit.arguments import apply_preset, config_from_args, request_from_args
    from ghostedit.engine import Engine
    style = ensure_tiny_lora("kohya", tmp_path)
    image = tmp_path / "in.png"
    Image.new("RGB", (64, 64), (200, 40, 40)).save(image)
    args = cli.build_parser().parse_args([
        "edit", "--preset", "lightning-4", "--lora", f"{style}:0.5", "--image", str(image), "--prompt", "make it blue",
        "--width", "64", "--height", "64", "--out", str(tmp_path / "out.png")])
    config, steps, cfg = apply_preset(args, "Qwen/Qwen-Image-Edit-2509", config_from_args(args), default_steps=40)
    printed = capsys.readouterr().out
    assert "[download] lightx2v/Qwen-Image-Lightning: 42.2 KB in 1 file" in printed and "42.2 KB ready" in printed
    request = request_from_args(args, steps, cfg)
    assert (request.steps, request.cfg_scale) == (4, 1.0)
    result = Engine("tiny", device="cpu", dtype="float32").run(request, config)
    assert len(result.telemetry.step_seconds) == 4
    assert result.config.value("scheduler") == "lightning"
    fused = [words for name, words in result.prepared_report.items() if name.startswith("LoRA ")]
    assert len(fused) == 2 and any("scale 0.5" in words for words in fused), result.prepared_report


def test_cli_refuses_a_preset_for_the_tiny_model(tmp_path, capsys):
    assert cli.main(["edit", "--model", "tiny", "--device", "cpu", "--preset", "lightning-8", "--image", "x.png",
                     "--prompt", "p", "--out", str(tmp_path / "o.png")]) == 2
    assert capsys.readouterr().err.startswith("error: lightning-8: the tiny model has random weights")


@pytest.mark.parametrize("steps", [1, 4, 8])
def test_the_lightning_schedule_is_what_diffusers_computes_from_lightx2v_config(steps):
    """lightx2v's scheduler config (shift log(3) at every size, no terminal shift) in diffusers' scheduler, as its
    edit pipeline calls it, against the schedule the `scheduler=lightning` toggle runs."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift

    from ghostedit.models.exact import ReferenceSchedule
    from ghostedit.models.family import LIGHTNING_SCHEDULER
    config = {key: value for key, value in LIGHTNING_SCHEDULER.items() if not key.startswith("_")}
    reference = FlowMatchEulerDiscreteScheduler(**config)
    image_tokens = 4096  # 1024x1024: the shift does not depend on it here
    mu = calculate_shift(image_tokens, config["base_image_seq_len"], config["max_image_seq_len"],
                         config["base_shift"], config["max_shift"])
    reference.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
    ours = ReferenceSchedule(LIGHTNING_SCHEDULER)
    ours.set_timesteps(steps, dynamic_shift_len=image_tokens)
    assert torch.equal(ours.sigmas, reference.sigmas[:-1].to(torch.float32))


def test_the_lightning_toggle_runs_its_schedule(engine, house):
    from ghostedit import EditRequest
    request = EditRequest(images=[house], prompt="make it night", steps=4, cfg_scale=1.0, width=64, height=64)
    model, lightning = (engine.run(request, OptimizationConfig(scheduler=choice)) for choice in ("model", "lightning"))
    difference = np.abs(np.asarray(model.image, dtype=np.int16) - np.asarray(lightning.image, dtype=np.int16))
    assert difference.mean() > 1  # before: the exact pipeline put its own schedule back and the two were equal


# ---- Qwen-Image-2.1: lightx2v/Qwen-Image-2.1-Lightning, one 4-step LoRA in diffusers/PEFT keys ----

LIGHTNING_21 = "lightx2v/Qwen-Image-2.1-Lightning"


def test_2_1_gets_its_4_step_lora_and_the_rest_is_refused_with_the_reason():
    from ghostedit.models.family import QWEN_IMAGE_21
    assert model_family("Qwen/Qwen-Image-2.1") == QWEN_IMAGE_21
    assert LIGHTNING["lightning-4"].lora_reference(QWEN_IMAGE_21) == f"{LIGHTNING_21}:pytorch_lora_weights.safetensors"
    with pytest.raises(PresetError, match="publishes its Lightning LoRA for 4 steps, not 8"):
        LIGHTNING["lightning-8"].lora_reference(QWEN_IMAGE_21)
    with pytest.raises(PresetError, match="Qwen-Image-2.1-Turbo: no Lightning LoRA is known for it"):
        model_family("Qwen/Qwen-Image-2.1-Turbo")


def test_the_2_1_lightning_schedule_is_the_models_own_without_its_terminal_stretch_as_diffusers_computes_it():
    """The 2.1 LoRA's card: four steps with dynamic exponential shifting and no terminal stretching. diffusers'
    QwenImage21Pipeline's schedule from the released scheduler config with shift_terminal None (its default sigmas
    for 4 steps and its shift at 1024x1024's tokens) against the one `scheduler=lightning` runs for 2.1."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.qwenimage21.pipeline_qwenimage21 import calculate_shift

    from ghostedit.models.exact import ReferenceSchedule
    from ghostedit.models.family import QWEN_IMAGE_21
    from ghostedit.models.qwen_image_21.pipeline import SCHEDULER_DEFAULTS
    schedule = QWEN_IMAGE_21.lightning_schedule()
    assert schedule == {**QWEN_IMAGE_21.schedule, "shift_terminal": None}
    released = {**SCHEDULER_DEFAULTS, **QWEN_IMAGE_21.schedule}
    reference = FlowMatchEulerDiscreteScheduler.from_config({**released, "shift_terminal": None})
    image_tokens = 4096
    config = reference.config
    mu = calculate_shift(image_tokens, config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096),
                         config.get("base_shift", 0.5), config.get("max_shift", 1.15))
    reference.set_timesteps(sigmas=np.linspace(1.0, 1 / 4, 4), mu=mu)
    ours = ReferenceSchedule({**SCHEDULER_DEFAULTS, **schedule})
    ours.set_timesteps(4, dynamic_shift_len=image_tokens)
    assert torch.equal(ours.sigmas, reference.sigmas[:-1].to(torch.float32))
    model = ReferenceSchedule(released)
    model.set_timesteps(4, dynamic_shift_len=image_tokens)
    assert not torch.equal(model.sigmas, ours.sigmas)  # the released schedule stretches to its terminal shift


def test_the_2_1_preset_runs_its_lora_and_schedule_on_the_tiny_2_1_engine(tmp_path, monkeypatch, capsys):
    """`edit --preset lightning-4` for Qwen/Qwen-Image-2.1, run on the tiny 2.1 engine (the fake Hub's file is a
    diffusers/PEFT LoRA keyed for the tiny 2.1 DiT): the LoRA fetched with printed progress and fused with every
    layer matched, 4 steps at CFG 1 on the Lightning schedule (the image differs from the same LoRA's on the model's
    own schedule)."""
    from ghostedit.arguments import apply_preset, config_from_args, request_from_args
    from ghostedit.engine import Engine
    from qwen21_loras import LORA_TARGETS, qwen21_lora_file
    lora = qwen21_lora_file(tmp_path, "diffusers").read_bytes()
    with hub_serving({LIGHTNING_21: Repo({"pytorch_lora_weights.safetensors": lora})}, tmp_path / "hf-cache",
                     monkeypatch):
        args = cli.build_parser().parse_args([
            "edit", "--preset", "lightning-4", "--prompt", "a lighthouse at dusk", "--width", "64", "--height", "64",
            "--out", str(tmp_path / "out.png")])
        config, steps, cfg = apply_preset(args, "Qwen/Qwen-Image-2.1", config_from_args(args), default_steps=40)
    assert f"[download] {LIGHTNING_21}" in capsys.readouterr().out
    request = request_from_args(args, steps, cfg)
    assert (request.steps, request.cfg_scale) == (4, 1.0)
    engine = Engine("tiny-2.1", device="cpu", dtype="float32")
    result = engine.run(request, config)
    assert result.config.value("scheduler") == "lightning" and len(result.telemetry.step_seconds) == 4
    (applied,) = result.telemetry.loras
    assert applied["layers_matched"] == 2 * len(LORA_TARGETS) and applied["keys_not_applied"] == 0, applied
    plain = engine.run(request, config.replace(scheduler="model"))  # the same LoRA on the model's own schedule
    difference = np.abs(np.asarray(result.image, dtype=np.int16) - np.asarray(plain.image, dtype=np.int16))
    assert difference.mean() > 1
