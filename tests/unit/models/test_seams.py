"""The seams a DiT family's forward calls (ghostedit/models/seams.py), on the CPU: one attention dispatch over the
backends, layouts, masks (dense and block-causal spans), a cached prefix's keys, the FP8 path's scales; the prefix KV
cache's branches; the run's options object."""
import dataclasses

import pytest
import torch

from ghostedit.kernels import fp8_attention
from ghostedit.models import seams
from ghostedit.models.qwen_image.dit import diffsynth_attention
from ghostedit.models.seams import DitOptions, PrefixKVCache, Segments


def _streams(lengths=(5, 11), heads=2, dim=16, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(1, length, heads, dim, generator=generator) for _ in range(3)) for length in lengths]


def _joined(streams):
    return [torch.cat(parts, dim=1).transpose(1, 2) for parts in zip(*streams)]


def _reference(q, k, v, mask=None):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).flatten(2)


@pytest.mark.parametrize("backend", ["diffsynth", "sdpa-math", "sdpa-flash"])
def test_every_cpu_backend_attends_over_the_joined_streams_in_either_layout(backend):
    streams = _streams()
    expected = _reference(*_joined(streams))
    options = DitOptions(attention=backend)
    by_tokens = seams.attention(streams, options, diffsynth=diffsynth_attention)
    by_heads = seams.attention([tuple(t.transpose(1, 2) for t in s) for s in streams], options, layout="bhsd",
                               diffsynth=diffsynth_attention)
    assert by_tokens.shape == expected.shape == (1, 16, 32)
    torch.testing.assert_close(by_tokens, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(by_tokens, by_heads)


def test_the_sdpa_backends_call_the_kernels_sdpa_chooses_bit_for_bit():
    """Each SDPA backend calls its ATen kernel directly (no process-wide flags): the same bits as SDPA restricted to
    that backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = _joined(_streams(lengths=(40, 300), dim=32))
    for name, chosen in (("sdpa-math", SDPBackend.MATH), ("sdpa-flash", SDPBackend.FLASH_ATTENTION)):
        with sdpa_kernel([chosen]):
            expected = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        assert torch.equal(seams.attend_heads_first(q, k, v, name), expected.transpose(1, 2).flatten(2)), name


def test_a_cached_prefix_is_attended_as_keys_joined_before_the_streams():
    prefix_stream, target = _streams(lengths=(7, 9))
    expected = _reference(*_joined([prefix_stream, target]))[:, 7:]
    output = seams.attention([target], DitOptions(attention="sdpa-math"), prefix=prefix_stream[1:])
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-5)


def test_block_causal_segments_equal_the_dense_block_causal_mask():
    """Text causal per token, each reference bidirectional inside itself, the target sees everything; a padded text
    key is attended by none."""
    (stream,) = _streams(lengths=(20,))
    spans = ((0, 6, True), (6, 10, False), (10, 14, False))
    valid = torch.ones(1, 20, dtype=torch.bool)
    valid[0, 5] = False
    dense = torch.zeros(20, 20, dtype=torch.bool)
    for start, end, causal in spans:
        dense[start:end, :end] = True
        if causal:
            dense[start:end, start:end] = torch.ones(end - start, end - start, dtype=torch.bool).tril()
    dense[14:] = True
    dense = dense & valid[0]
    dense[5, 5] = True  # a padded query keeps a key (its row is never read)
    q, k, v = _joined([stream])
    expected = _reference(q, k, v, dense)
    with_block_mask = Segments(spans, valid, seams.flex_block_mask(Segments(spans, valid), 20, 1, "cpu"))
    for backend in ("sdpa-flash", "diffsynth", "flex"):
        output = seams.attention([stream], DitOptions(attention=backend), mask=with_block_mask,
                                 diffsynth=diffsynth_attention)
        rows = [row for row in range(20) if row != 5]
        torch.testing.assert_close(output[:, rows], expected[:, rows], rtol=1e-5, atol=1e-5)


def test_a_dense_mask_is_refused_by_the_fp8_attention():
    streams = _streams()
    with pytest.raises(RuntimeError, match="takes no attention mask"):
        seams.attention(streams, DitOptions(attention="cudnn-fp8"), mask=torch.ones(16, 16, dtype=torch.bool))


def _cpu_fp8_kernel(q, k, v, q_descale, k_descale, v_descale):
    """cuDNN's FP8 op on the CPU: FP8 parts joined along the sequence, the output in FP8 scaled as v is."""
    q, k, v = (torch.cat([part.float() for part in parts], dim=1).transpose(1, 2) for parts in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q * q_descale, k * k_descale, v * v_descale)
    return (out / v_descale).transpose(1, 2).to(torch.float8_e4m3fn)


def test_the_fp8_backend_casts_each_stream_with_the_given_scales(monkeypatch):
    monkeypatch.setattr(fp8_attention, "cudnn_fp8_attention", _cpu_fp8_kernel)
    streams = _streams()
    expected = _reference(*_joined(streams))
    scales = tuple(fp8_attention.fp8_scale(torch.cat([s[i] for s in streams], 1).abs().max() * 1.5) for i in (0, 1))
    output = seams.attention(streams, DitOptions(attention="cudnn-fp8"), fp8_scales=scales)
    assert float((output - expected).norm() / expected.norm()) < 0.08


def test_a_fused_linear_computes_its_parts_side_by_side_and_views_parts_laid_end_to_end():
    generator = torch.Generator().manual_seed(0)
    storage = torch.randn(3 * 4 * 6, generator=generator)
    parts = [torch.nn.Linear(6, 4) for _ in range(3)]
    for index, part in enumerate(parts):  # laid end to end, as a pinned base lays joinable parts
        part.weight = torch.nn.Parameter(storage[index * 24:(index + 1) * 24].view(4, 6), requires_grad=False)
    fused = seams.fused_linear(parts)
    x = torch.randn(2, 6, generator=generator)
    assert torch.equal(fused(x), torch.cat([part(x) for part in parts], dim=-1))
    assert fused.weight.data_ptr() == storage.data_ptr()  # a view: nothing copied
    assert seams.joinable_parts(torch.nn.ModuleDict({"a": parts[0], "b": parts[1], "c": parts[2]}),
                                {"abc": ("a", "b", "c")}) == [[p.weight for p in parts], [p.bias for p in parts]]


def test_the_prefix_cache_keeps_each_branch_and_block_from_its_first_step():
    cache = PrefixKVCache()
    keys, values = torch.randn(1, 3, 2, 4), torch.randn(1, 3, 2, 4)
    for step in range(2):
        for branch in range(2):  # a step's branches: the positive then the negative pass
            forward = cache.begin(step)
            assert forward.branch == branch and forward.filling == (step == 0)
            if forward.filling:
                forward.store(0, keys * (branch + 1), values)
            else:
                assert torch.equal(forward.stored(0, keys.shape, keys.dtype)[0], keys * (branch + 1))
            cache.done(10 if step == 0 else 4)
    assert cache.summary() == {"branches": 2, "tokens_computed": [10, 10, 4, 4]}


def test_caches_given_the_same_kept_tensors_write_them_in_place_each_shape_its_own():
    """What a graphed forward needs: the next edit's cache fills the very tensors the last one's cached steps read
    (a graph replays them at their addresses), and a prefix of another shape gets tensors of its own."""
    kept = {}
    addresses = []
    for edit, tokens in enumerate((3, 3, 5)):
        cache = PrefixKVCache(kept)
        keys = torch.full((1, tokens, 2, 4), float(edit))
        cache.begin(0).store(0, keys, keys + 1)
        cache.done(tokens + 2)
        stored = cache.begin(1).stored(0, keys.shape, keys.dtype)
        assert torch.equal(stored[0], keys) and torch.equal(stored[1], keys + 1)
        addresses.append(stored[0].data_ptr())
    assert addresses[0] == addresses[1] != addresses[2] and len(kept) == 2


def test_the_options_are_frozen_and_replaced_whole():
    options = DitOptions(attention="sdpa-math", real_rope=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.real_rope = False
    changed = options.replace(carried_residual=True)
    assert changed.carried_residual and not options.carried_residual and changed.attention == "sdpa-math"
    assert DitOptions(attention="sdpa-math", real_rope=True) == options
