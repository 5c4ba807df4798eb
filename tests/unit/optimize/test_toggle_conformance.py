"""Every toggle and every choice, read from the registry, held to what a toggle promises, on the tiny model on the CPU:

- a choice that cannot run here is refused by the engine with the reason its declaration gives;
- one that can prepares (with what its requirements ask), runs, and leaves the base weights as they were;
- its cache key is stable: the same from its text, and apart from the default's only where the toggle changes the
  prepared pipeline;
- a lossless choice computes the stock forward bit for bit, or, where it runs other kernels (an attention backend,
  compiled code), within their rounding;
- with a runtime LoRA it computes what the same LoRA fused computes (a lossy choice: what the LoRA computes on the
  stock forward, within the choice's loss), or is refused with its reason;
- under Ulysses on two gloo processes it gives the one-process forward bit for bit.

Choices of the text encoder and the VAE are held to the same on whole edits. Each DiT family is held apart: a choice
that does not apply to a family (the registry's `families`) is refused on its model with that reason, and the
choices that apply to Qwen-Image-2.1's DiT are held to the same on whole edits of the tiny 2.1 (its prefix cache
filled at the first step and read at the second), and so are its text encoder's and VAE's, and under Ulysses give
the one-process edit image for image. The
GPU-only choices' paths run on the CPU with their kernels emulated in tests/unit/parallel/test_sequence_split.py, and
on the GPU in scripts/gpu/."""
import os

import pytest
import torch
import torch.multiprocessing

from conftest import ASSETS
from dit_helpers import dit_engine, inputs_for
from gloo_runs import free_port
from qwen21_loras import qwen21_lora_file
from ghostedit import EditRequest, OptimizationConfig
from ghostedit.bench.dit import running
from ghostedit.config import LoraChoice
from ghostedit.device import UnavailableOptionError
from ghostedit.engine import Engine
from ghostedit.models.family import QWEN_IMAGE_21_DIT, QWEN_IMAGE_DIT
from ghostedit.models.tiny import ensure_tiny_lora
from ghostedit.optimize import registry
from ghostedit.telemetry import RunRecorder

# lossless choices that compute with other kernels than stock, so only up to their rounding, and why
OTHER_KERNELS = {"attention": "another kernel computes the same attention",
                 "compile": "Inductor's generated kernels fuse and round as they compute",
                 "inductor-cdt": "Inductor's generated kernels", "inductor-multi-kernel": "Inductor's generated kernels",
                 "inductor-persistent-rows": "Inductor's generated kernels",
                 "text-encoder": "compiled code, or the vision windows in one attention call"}
ROUNDING = 1e-5   # relative error allowed where other kernels compute the same function, float32
LOSSY = 0.15      # a lossy choice's relative error on the tiny DiT's output (FP8 weights: about 0.07)
LORA_SCALE = 0.8
FAMILIES = {"tiny": QWEN_IMAGE_DIT, "tiny-2.1": QWEN_IMAGE_21_DIT}  # each DiT family's embedded tiny model


def choices():
    """(toggle, value) for every choice of every toggle but its default, in preparation order."""
    return [(toggle.name, choice.value) for toggle in registry.toggles() for choice in toggle.choices
            if choice.value != toggle.default]


def settings_for(name: str, value: str) -> dict:
    """The settings that choose `value` of toggle `name` with what it requires (recursively): a required flag on,
    another toggle at the first value its requirement takes."""
    wanted = {name: value}
    pending = [(name, value)]
    while pending:
        toggle = registry.get(pending.pop()[0])
        for requirement in toggle.choice(wanted[toggle.name]).requires:
            needed = registry.get(requirement.toggle)
            pick = next(v for v in (requirement.values or needed.values) if requirement.accepts(v))
            if requirement.toggle not in wanted:
                wanted[requirement.toggle] = pick
                pending.append((requirement.toggle, pick))
    settings = {}
    for toggle_name, toggle_value in wanted.items():
        toggle = registry.get(toggle_name)
        if toggle.group is None:
            settings[toggle_name] = toggle_value
        elif toggle_value == registry.ON:  # a group's flags are a tuple
            settings[toggle.group] = settings.get(toggle.group, ()) + (toggle_name,)
    return settings


def config_for(name: str, value: str) -> OptimizationConfig:
    return OptimizationConfig(**settings_for(name, value))


def available(config: OptimizationConfig, family: str = QWEN_IMAGE_DIT) -> registry.Availability:
    """Whether every choice of `config` runs here and on the DiT family `family`, else the first reason why not, in
    the engine's order: this machine's reasons, then the family's."""
    chosen = [(toggle, config.value(toggle.name)) for toggle in registry.toggles()
              if config.value(toggle.name) != toggle.default]
    for check in (lambda toggle, value: registry.availability(toggle, value, "cpu"),
                  lambda toggle, value: registry.family_availability(toggle, value, family)):
        for toggle, value in chosen:
            found = check(toggle, value)
            if not found.ok:
                return found
    return registry.Availability.yes()


ALL = choices()
IDS = [f"{name}={value}" for name, value in ALL]


def test_every_toggle_is_held_to_it():
    """The suite covers the registry as it is: a new toggle file is in it without an edit here."""
    assert {name for name, _ in ALL} == {toggle.name for toggle in registry.toggles()
                                         if len(toggle.choices) > 1}
    assert len(ALL) == sum(len(toggle.choices) - 1 for toggle in registry.toggles())


def test_every_toggle_says_for_each_family_whether_it_applies():
    """A choice applies to each DiT family or says why not, in words a person can read."""
    for toggle in registry.toggles():
        for choice in toggle.choices:
            for family in FAMILIES.values():
                found = registry.family_availability(toggle, choice.value, family)
                assert found.ok or len(found.reason) > 30, (toggle.name, choice.value, family)
    assert _dit_choices(QWEN_IMAGE_21_DIT), "some DiT choices apply to 2.1 on the CPU"


@pytest.fixture(scope="module")
def engines():
    """The engine of each family's tiny model (nothing loaded: a check reads the declarations)."""
    return {model: Engine(model, device="cpu") for model in FAMILIES}


@pytest.mark.parametrize("model", FAMILIES)
@pytest.mark.parametrize("name, value", ALL, ids=IDS)
def test_a_choice_that_cannot_run_here_is_refused_with_its_reason(engines, model, name, value):
    engine, config = engines[model], config_for(name, value)
    found = available(config, FAMILIES[model])
    if found.ok:
        engine.check(config)
        return
    assert found.reason
    with pytest.raises(UnavailableOptionError, match="is unavailable: ") as refused:
        engine.check(config)
    assert found.reason in str(refused.value)


@pytest.mark.parametrize("name, value", ALL, ids=IDS)
def test_the_cache_key_is_stable_and_follows_the_declaration(name, value):
    config = config_for(name, value)
    assert OptimizationConfig.parse(config.text).cache_key == config.cache_key == config_for(name, value).cache_key
    toggle = registry.get(name)
    without = config.replace(**({toggle.group: tuple(f for f in config.flags(toggle.group) if f != name)}
                                if toggle.group else {name: toggle.default}))
    changes_prepared = toggle.changes == registry.PREPARED and \
        toggle.prepared_key(value) != toggle.prepared_key(toggle.default)
    assert (config.cache_key != without.cache_key) == changes_prepared


@pytest.fixture(scope="module")
def dit():
    """The tiny DiT alone (float32), its stock output, and a copy of its base weights."""
    engine = dit_engine()
    inputs = inputs_for(engine)
    base = {name: tensor.clone() for name, tensor in engine.load().dit.state_dict().items()}
    return engine, inputs, _output(engine, OptimizationConfig(), inputs), base


def _output(engine, config, inputs):
    prepared, _ = engine.prepare(config)
    with running(prepared, config, inputs, "cpu", RunRecorder("cpu")) as (call, _):
        return call()


def _relative(output, reference) -> float:
    return float((output - reference).norm() / reference.norm())


def _dit_choices(family: str = QWEN_IMAGE_DIT):
    return [(name, value) for name, value in ALL if registry.get(name).component == "dit"
            and registry.get(name).changes != registry.PLACEMENT and available(config_for(name, value), family).ok]


DIT = _dit_choices()
DIT_IDS = [f"{name}={value}" for name, value in DIT]


@pytest.mark.parametrize("name, value", DIT, ids=DIT_IDS)
def test_a_dit_choice_prepares_runs_and_leaves_the_base_weights(dit, name, value):
    engine, inputs, stock, base = dit
    config = config_for(name, value)
    output = _output(engine, config, inputs)
    assert torch.isfinite(output).all()
    assert all(torch.equal(tensor, base[key]) for key, tensor in engine.load().dit.state_dict().items())
    if config.lossy:
        return
    if any(setting in OTHER_KERNELS for setting in settings_for(name, value)):
        assert _relative(output, stock) <= ROUNDING
    else:
        assert torch.equal(output, stock)


@pytest.mark.parametrize("name, value", DIT, ids=DIT_IDS)
def test_a_dit_choice_with_a_runtime_lora_computes_the_fused_lora_or_says_why_not(dit, name, value):
    engine, inputs, stock, _ = dit
    config = config_for(name, value)
    path = ensure_tiny_lora("peft")
    runtime, fused = (LoraChoice.from_file(path, LORA_SCALE, mode) for mode in ("runtime", "fused"))
    reason = registry.get(name).choice(value).needs_fused_loras
    if reason:
        with pytest.raises(ValueError, match="needs fused LoRAs"):
            config.replace(loras=(runtime,))
        return
    with_runtime = _output(engine, config.replace(loras=(runtime,)), inputs)
    if config.lossy:  # FP8 weights: the fused LoRA is quantized with the weight, the runtime one is not
        exact_lora = _output(engine, OptimizationConfig(loras=(fused,)), inputs)
        assert _relative(with_runtime, exact_lora) <= LOSSY and _relative(with_runtime, stock) > 1e-3
        return
    with_fused = _output(engine, config.replace(loras=(fused,)), inputs)
    assert _relative(with_runtime, with_fused) <= 1e-5 and _relative(with_fused, stock) > 1e-3


# ---- the text encoder's and the VAE's choices, on whole edits ----

EDIT = [(name, value) for name, value in ALL if registry.get(name).component in ("text_encoder", "vae")
        and available(config_for(name, value)).ok]


@pytest.fixture(scope="module")
def edit_engine():
    from ghostedit.engine import Engine
    engine = Engine("tiny", device="cpu", dtype="float32")
    return engine, engine.run(_request(), OptimizationConfig())


def _request():
    from PIL import Image
    return EditRequest(images=[Image.open(ASSETS / "house.png").convert("RGB")], prompt="ghostly", width=64,
                       height=64, steps=2, seed=1)


@pytest.mark.parametrize("name, value", EDIT, ids=[f"{name}={value}" for name, value in EDIT])
def test_an_encoder_choice_edits_as_stock_and_leaves_the_base_weights(edit_engine, name, value):
    import numpy as np
    engine, stock = edit_engine
    component = registry.get(name).component
    before = {key: tensor.clone() for key, tensor in getattr(engine.load(), component).state_dict().items()}
    result = engine.run(_request(), config_for(name, value))
    assert all(torch.equal(tensor, before[key]) for key, tensor in getattr(engine.load(), component).state_dict().items())
    difference = np.abs(np.asarray(result.image, dtype=np.int16) - np.asarray(stock.image, dtype=np.int16))
    assert difference.max() <= (1 if name in OTHER_KERNELS else 0), difference.max()


# ---- Qwen-Image-2.1's DiT: the choices that apply to it, on whole edits of the tiny 2.1 ----

DIT_21 = _dit_choices(QWEN_IMAGE_21_DIT)
DIT_21_IDS = [f"{name}={value}" for name, value in DIT_21]
OTHER_KERNELS_LEVELS = 1   # 8-bit levels an image may move where other kernels compute the same function
LOSSY_LEVELS = 6           # mean levels a lossy choice's image may move on the tiny 2.1 (FP8 weights: about 1)
# choices that sample another way by design (a whole edit runs them; a lone DiT forward, the Edit family's check,
# does not): their image must differ from stock's
OTHER_SAMPLING = {("scheduler", "lightning"): "the Lightning LoRA's schedule"}


@pytest.fixture(scope="module")
def engine_21():
    """The tiny 2.1 in float32, a copy of its DiT's base weights and stock's image."""
    engine = Engine("tiny-2.1", device="cpu", dtype="float32")
    base = {name: tensor.clone() for name, tensor in engine.load().dit.state_dict().items()}
    return engine, base, _pixels(engine.run(_request_21(), OptimizationConfig()).image)


def _request_21() -> EditRequest:
    """An edit with one reference (a block-causal prefix of text and image), two steps: the first fills the prefix
    cache, the second reads it."""
    from PIL import Image
    return EditRequest(images=[Image.open(ASSETS / "house.png").convert("RGB")], prompt="ghostly", width=64,
                       height=64, steps=2, cfg_scale=1.0, seed=1)


def _pixels(image):
    import numpy as np
    return np.asarray(image, dtype=np.int16)


@pytest.mark.parametrize("name, value", DIT_21, ids=DIT_21_IDS)
def test_a_2_1_dit_choice_prepares_runs_and_leaves_the_base_weights(engine_21, name, value):
    engine, base, stock = engine_21
    config = config_for(name, value)
    result = engine.run(_request_21(), config)
    assert all(torch.equal(tensor, base[key]) for key, tensor in engine.load().dit.state_dict().items())
    first, second = result.telemetry.dit_tokens
    assert (second == first) == (config.value("prefix-cache") == registry.OFF), (first, second)
    difference = abs(_pixels(result.image) - stock)
    if (name, value) in OTHER_SAMPLING:
        assert difference.mean() > 0, OTHER_SAMPLING[name, value]
    elif config.lossy:  # a step cache on random weights serves no step (tests/unit/optimize/test_step_cache.py raises its threshold)
        served_nothing = (result.telemetry.step_cache or {}).get("forwards_cached") == 0
        assert (0 < difference.mean() or served_nothing) and difference.mean() <= LOSSY_LEVELS, difference.mean()
    elif any(setting in OTHER_KERNELS for setting in settings_for(name, value)):
        assert difference.max() <= OTHER_KERNELS_LEVELS, difference.max()
    else:  # the prefix cache off: the same attention over the same keys, in float32
        assert difference.max() == 0, difference.max()


EDIT_21 = [(name, value) for name, value in ALL if registry.get(name).component in ("text_encoder", "vae")
           and available(config_for(name, value), QWEN_IMAGE_21_DIT).ok]


@pytest.mark.parametrize("name, value", EDIT_21, ids=[f"{name}={value}" for name, value in EDIT_21])
def test_a_2_1_encoder_choice_edits_as_stock_and_leaves_the_base_weights(engine_21, name, value):
    engine, _, stock = engine_21
    component = registry.get(name).component
    before = {key: tensor.clone() for key, tensor in getattr(engine.load(), component).state_dict().items()}
    result = engine.run(_request_21(), config_for(name, value))
    assert all(torch.equal(tensor, before[key])
               for key, tensor in getattr(engine.load(), component).state_dict().items())
    difference = abs(_pixels(result.image) - stock)
    assert difference.max() <= (OTHER_KERNELS_LEVELS if name in OTHER_KERNELS else 0), difference.max()


@pytest.fixture(scope="module")
def lora_21(tmp_path_factory):
    """A LoRA of the tiny 2.1 in diffusers' published keys, as runtime and as fused."""
    path = qwen21_lora_file(tmp_path_factory.mktemp("lora-21"), "diffusers")
    return tuple(LoraChoice.from_file(path, LORA_SCALE, mode) for mode in ("runtime", "fused"))


@pytest.mark.parametrize("name, value", DIT_21, ids=DIT_21_IDS)
def test_a_2_1_dit_choice_with_a_runtime_lora_computes_the_fused_lora_or_says_why_not(engine_21, lora_21, name,
                                                                                      value):
    engine, _, stock = engine_21
    runtime, fused = lora_21
    config = config_for(name, value)
    reason = registry.get(name).choice(value).needs_fused_loras
    if reason:
        with pytest.raises(ValueError, match="needs fused LoRAs"):
            config.replace(loras=(runtime,))
        return
    with_runtime = _pixels(engine.run(_request_21(), config.replace(loras=(runtime,))).image)
    exact_lora = config if not config.lossy else OptimizationConfig()  # FP8: the fused LoRA on stock's weights
    with_fused = _pixels(engine.run(_request_21(), exact_lora.replace(loras=(fused,))).image)
    assert abs(with_fused - stock).mean() > 1, "the LoRA changes the image"
    difference = abs(with_runtime - with_fused)
    if config.lossy:
        assert difference.mean() <= LOSSY_LEVELS, difference.mean()
    else:
        assert difference.max() <= OTHER_KERNELS_LEVELS, difference.max()


# ---- under Ulysses: two gloo processes ----

def _under_ulysses(choices):
    """The choices held under Ulysses: every one but compile's own and its Inductor options (compile regional
    stands for them)."""
    return [(name, value) for name, value in choices if not registry.get(name).compile_options and name != "compile"] \
        + [("compile", "regional")]


ULYSSES = _under_ulysses(DIT)
ULYSSES_21 = _under_ulysses(DIT_21)


def _ulysses_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    from ghostedit.bench.dit import dit_inputs
    from ghostedit.parallel import mesh as meshes
    engine = dit_engine()
    inputs = {**dit_inputs(engine.load().dit, 80, 48, 8, "cpu", engine.torch_dtype, edit_images=2),
              "zero_cond_t": True}   # 45 image tokens (23 and 22 on the ranks) and 8 text tokens
    results = {}
    try:
        mesh = meshes.setup("ulysses", True, "cpu")
        engine_21 = Engine("tiny-2.1", device="cpu", dtype="float32")
        for name, value in ULYSSES_21:  # whole 2.1 edits: its prefix cache filled, then read
            images = []
            for each in (None, mesh):
                engine_21.mesh = each
                images.append(engine_21.run(_request_21(), config_for(name, value)).image.tobytes())
            results[f"2.1 {name}={value}"] = images[0] == images[1]
        for name, value in ULYSSES:
            config = config_for(name, value)
            prepared, _ = engine.prepare(config)
            outputs = []
            for each in (None, mesh):
                with running(prepared, config, inputs, "cpu", RunRecorder("cpu"), each) as (call, _):
                    outputs.append(call())
            results[f"{name}={value}"] = torch.equal(*outputs)
    finally:
        meshes.teardown()
    torch.save(results, f"{out_dir}/rank{rank}.pt")


@pytest.fixture(scope="module")
def ulysses_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("conformance-ulysses")
    torch.multiprocessing.spawn(_ulysses_worker, args=(2, free_port(), str(out)), nprocs=2)
    return [torch.load(out / f"rank{rank}.pt") for rank in range(2)]


@pytest.mark.parametrize("name, value", ULYSSES, ids=[f"{name}={value}" for name, value in ULYSSES])
def test_under_ulysses_a_dit_choice_gives_the_one_process_forward_bit_for_bit(ulysses_results, name, value):
    for rank, results in enumerate(ulysses_results):
        assert results[f"{name}={value}"], rank


@pytest.mark.parametrize("name, value", ULYSSES_21, ids=[f"{name}={value}" for name, value in ULYSSES_21])
def test_under_ulysses_a_2_1_edit_with_a_dit_choice_is_the_one_process_edit_bit_for_bit(ulysses_results, name, value):
    for rank, results in enumerate(ulysses_results):
        assert results[f"2.1 {name}={value}"], rank
