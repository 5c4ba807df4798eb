"""The preparation's copy of the base DiT (engine/prepare.clone_sharing_weights): what copy.deepcopy with the shared
weights in its memo gives, made module by module, on the tiny DiT with its weights and on the released DiT's shape
(built on the meta device: no memory)."""
import copy

import pytest
import torch
from dit_helpers import dit_engine, inputs_for
from ghostedit.engine.prepare import clone_sharing_weights
from ghostedit.models.qwen_image.dit import QwenImageDiT, model_fn


@pytest.fixture(scope="module")
def tiny_dit():
    return dit_engine().load().dit


@pytest.fixture(scope="module")
def released_shape():
    with torch.device("meta"):
        return QwenImageDiT(num_layers=60).to(torch.bfloat16).eval()


def deepcopy_sharing_weights(module):
    """The reference: deepcopy, new Parameters over the same storage and the same buffers given in its memo."""
    memo = {id(p): torch.nn.Parameter(p.data, requires_grad=False) for p in module.parameters()}
    memo.update({id(b): b for b in module.buffers()})
    return copy.deepcopy(module, memo)


def described(value):
    """A value as deepcopy makes it, compared by content (a tensor by its make and, off the meta device, values)."""
    if isinstance(value, torch.Tensor):
        content = None if value.is_meta else value.cpu().tolist()
        return type(value).__name__, value.dtype, tuple(value.shape), value.device.type, content
    if isinstance(value, dict):
        return type(value).__name__, {key: described(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set)):
        return type(value).__name__, [described(item) for item in value]
    if isinstance(value, torch.nn.Module):
        return "module", type(value).__name__
    return value


def module_states(root):
    return {name: {key: described(value) for key, value in module.__dict__.items()}
            for name, module in root.named_modules()}


@pytest.mark.parametrize("which", ["tiny_dit", "released_shape"])
def test_the_copy_is_deepcopys_module_for_module(which, request):
    base = request.getfixturevalue(which)
    expected, clone = deepcopy_sharing_weights(base), clone_sharing_weights(base)
    assert module_states(clone) == module_states(expected)
    for (name, ours), (_, theirs), (_, original) in zip(clone.named_modules(), expected.named_modules(),
                                                        base.named_modules()):
        assert type(ours) is type(theirs) is type(original) and ours is not original, name
        for key, value in original.__dict__.items():
            copied = ours.__dict__[key]
            if key in ("_parameters", "_buffers", "_modules") or isinstance(value, (dict, list, set, torch.Tensor)):
                assert copied is not value, (name, key)   # the copy's own: changing it leaves the base as it is
        for key, parameter in original._parameters.items():
            copied = ours._parameters[key]
            if parameter is None:
                assert copied is None, (name, key)
                continue
            assert copied is not parameter and not copied.requires_grad, (name, key)
            assert copied.data_ptr() == parameter.data_ptr() or parameter.is_meta   # the same storage
        assert all(ours._buffers[key] is buffer for key, buffer in original._buffers.items()), name


def test_the_copy_computes_what_the_base_does_and_changing_it_leaves_the_base(tiny_dit):
    clone = clone_sharing_weights(tiny_dit)
    inputs = inputs_for(dit_engine())
    block, original = clone.transformer_blocks[0], tiny_dit.transformer_blocks[0]
    with torch.no_grad():
        assert torch.equal(model_fn(dit=clone, **inputs), model_fn(dit=tiny_dit, **inputs))
        weight = original.img_mlp.net[2].weight
        block.img_mlp.net[2].weight = torch.nn.Parameter(torch.zeros_like(weight), requires_grad=False)
    block.register_forward_hook(lambda *args: None)
    block.marked = True
    assert original.img_mlp.net[2].weight is weight and weight.abs().sum() > 0
    assert not original._forward_hooks and not hasattr(original, "marked")


class CopiesItself(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.copies = 0
        self.inner = torch.nn.Linear(2, 2)

    def __deepcopy__(self, memo):
        copied = CopiesItself()
        copied.copies = self.copies + 1
        return copied


def test_a_module_that_copies_itself_its_own_way_is_copied_its_way():
    root = torch.nn.Sequential(torch.nn.Linear(2, 2), CopiesItself())
    clone = clone_sharing_weights(root)
    assert clone[1].copies == 1 and clone[0].weight.data_ptr() == root[0].weight.data_ptr()
