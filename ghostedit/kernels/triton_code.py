"""GhostEdit's own Triton kernels, each run by the module that owns its choice: the GELU and its rowwise FP8
quantization (gelu_quant.py, fused-gelu-quant), SwiGLU's silu(gate) * up and its rowwise FP8 quantization
(swiglu_quant.py, fused-swiglu-quant) and the FP8 attention's q and k normalized, rotated and cast (qk_norm_rope.py,
fused-qk-norm-rope), each through a custom op that compiled blocks call; the VAE's RMS norm with the SiLU after it
(optimize/vae_frames.py, vae=image-fused). This module imports Triton: those modules load it only when a GPU
configuration runs them. Triton resolves a kernel's helper functions among the module's globals, hence one module for
them."""
import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def gelu_rowwise_fp8(x_ptr, out_ptr, scale_ptr, fp8_max, smallest_amax, n_columns: tl.constexpr,
                     BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    columns = tl.arange(0, BLOCK)
    mask = columns < n_columns
    x = tl.load(x_ptr + row * n_columns + columns, mask=mask, other=0.0).to(tl.float32)
    # GELU with the tanh approximation, as trained (0.5 x (1 + tanh(u)) written as x * sigmoid(2u))
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    gelu = (x * tl.sigmoid(2.0 * inner)).to(tl.bfloat16).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(gelu), axis=0), smallest_amax) / fp8_max
    tl.store(scale_ptr + row, scale)
    quantized = tl.clamp(gelu / scale, -fp8_max, fp8_max)
    tl.store(out_ptr + row * n_columns + columns, quantized.to(tl.float8e4nv), mask=mask)


@triton.jit
def swiglu_rowwise_fp8(gate_ptr, up_ptr, out_ptr, scale_ptr, fp8_max, inverse_fp8_max, smallest_amax,
                       n_columns: tl.constexpr, BLOCK: tl.constexpr, LIBDEVICE_EXP: tl.constexpr):
    """silu(gate) * up of one row, rounded as eager PyTorch rounds it, quantized as torchao quantizes it per row."""
    row = tl.program_id(0).to(tl.int64)
    columns = tl.arange(0, BLOCK)
    mask = columns < n_columns
    gate = tl.load(gate_ptr + row * n_columns + columns, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + row * n_columns + columns, mask=mask, other=0.0).to(tl.float32)
    # PyTorch's CUDA SiLU: x / (1 + expf(-x)) in float32 (libdevice's expf is CUDA's; Triton's interpreter has no
    # libdevice), rounded to bf16
    if LIBDEVICE_EXP:
        exp = libdevice.exp(-gate)
    else:
        exp = tl.exp(-gate)
    silu = tl.div_rn(gate, 1.0 + exp).to(tl.bfloat16).to(tl.float32)
    swiglu = (silu * up).to(tl.bfloat16).to(tl.float32)  # a product of two bf16 values, exact in float32
    # torchao's scale: the row's bf16 amax / 448, which PyTorch's CUDA division by a Python number computes as a
    # product with float32's 1 / 448, in bf16 (the amax's dtype)
    amax = tl.maximum(tl.max(tl.abs(swiglu), axis=0), smallest_amax)
    scale = (amax * inverse_fp8_max).to(tl.bfloat16).to(tl.float32)
    tl.store(scale_ptr + row, scale)
    quantized = tl.clamp(tl.div_rn(swiglu, scale), -fp8_max, fp8_max)
    tl.store(out_ptr + row * n_columns + columns, quantized.to(tl.float8e4nv), mask=mask)


@triton.jit
def _rotated_fp8(x_ptr, weight_even, weight_odd, cos_even, cos_odd, sin_even, sin_odd, scale, eps, fp8_max,
                 inside, HEADS_BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr):
    """One token's heads [HEADS_BLOCK, HEAD_DIM] from x_ptr, normalized, rotated, scaled and cast; the pairs
    (x[2i], x[2i+1]) that RoPE rotates are split apart in registers."""
    heads = tl.arange(0, HEADS_BLOCK)[:, None]
    x = tl.load(x_ptr + heads * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :], mask=inside, other=0.0)
    even, odd = tl.split(tl.reshape(x.to(tl.float32), (HEADS_BLOCK, HEAD_DIM // 2, 2)))
    inverse_rms = tl.rsqrt((tl.sum(even * even, axis=1) + tl.sum(odd * odd, axis=1)) / HEAD_DIM + eps)[:, None]
    even = even * inverse_rms * weight_even
    odd = odd * inverse_rms * weight_odd
    rotated = tl.join(even * cos_even + odd * sin_even, odd * cos_odd + even * sin_odd)
    values = tl.clamp(tl.reshape(rotated, (HEADS_BLOCK, HEAD_DIM)) * scale, -fp8_max, fp8_max)
    return values.to(tl.float8e4nv)

@triton.jit
def _pairs(ptr, HEAD_DIM: tl.constexpr):
    """The even and odd elements of a [HEAD_DIM] vector as float32 [1, HEAD_DIM / 2] each."""
    return tl.split(tl.reshape(tl.load(ptr + tl.arange(0, HEAD_DIM)).to(tl.float32), (1, HEAD_DIM // 2, 2)))

@triton.jit
def qk_norm_rope_fp8(q_ptr, k_ptr, q_weight_ptr, k_weight_ptr, cos_ptr, sin_ptr, q_scale_ptr, k_scale_ptr,
                     q_out_ptr, k_out_ptr, n_tokens, seq, heads, q_batch_stride, q_token_stride, k_batch_stride,
                     k_token_stride, out_first_token, out_seq, eps, fp8_max, HEAD_DIM: tl.constexpr,
                     HEADS_BLOCK: tl.constexpr, TOKENS: tl.constexpr):
    q_weight_even, q_weight_odd = _pairs(q_weight_ptr, HEAD_DIM)
    k_weight_even, k_weight_odd = _pairs(k_weight_ptr, HEAD_DIM)
    q_scale, k_scale = tl.load(q_scale_ptr), tl.load(k_scale_ptr)
    out_heads = tl.arange(0, HEADS_BLOCK)[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    for step in tl.static_range(TOKENS):
        token = tl.program_id(0) * TOKENS + step
        inside = (tl.arange(0, HEADS_BLOCK)[:, None] < heads) & (token < n_tokens)
        token = tl.minimum(token, n_tokens - 1).to(tl.int64)  # a tile's last tokens may lie past the end
        batch, position = token // seq, token % seq
        cos_even, cos_odd = _pairs(cos_ptr + position * HEAD_DIM, HEAD_DIM)
        sin_even, sin_odd = _pairs(sin_ptr + position * HEAD_DIM, HEAD_DIM)
        out_start = (batch * out_seq + out_first_token + position) * heads * HEAD_DIM
        q = _rotated_fp8(q_ptr + batch * q_batch_stride + position * q_token_stride, q_weight_even,
                         q_weight_odd, cos_even, cos_odd, sin_even, sin_odd, q_scale, eps, fp8_max, inside,
                         HEADS_BLOCK, HEAD_DIM)
        tl.store(q_out_ptr + out_start + out_heads, q, mask=inside)
        k = _rotated_fp8(k_ptr + batch * k_batch_stride + position * k_token_stride, k_weight_even,
                         k_weight_odd, cos_even, cos_odd, sin_even, sin_odd, k_scale, eps, fp8_max, inside,
                         HEADS_BLOCK, HEAD_DIM)
        tl.store(k_out_ptr + out_start + out_heads, k, mask=inside)


@triton.jit
def _channel_chunk(x_ptr, rows, chunk, inside, n_channels: tl.constexpr, CHUNK: tl.constexpr,
                   MASK_CHANNELS: tl.constexpr):
    """One chunk of CHUNK channels of the rows, as float32 [ROWS, CHUNK], and where it lies."""
    channels = chunk * CHUNK + tl.arange(0, CHUNK)[None, :]
    if MASK_CHANNELS:
        inside = inside & (channels < n_channels)
    return tl.load(x_ptr + rows * n_channels + channels, mask=inside, other=0.0).to(tl.float32), channels, inside


@triton.jit
def _biased(x, input_bias_ptr, channels, n_channels: tl.constexpr, dtype, INPUT_BIAS: tl.constexpr):
    """x plus a convolution's bias per channel, rounded to `dtype` as PyTorch's addition of it rounds."""
    if INPUT_BIAS:
        bias = tl.load(input_bias_ptr + channels, mask=channels < n_channels).to(tl.float32)
        x = (x + bias).to(dtype).to(tl.float32)
    return x


@triton.jit
def channel_rms_norm(x_ptr, input_bias_ptr, gamma_ptr, bias_ptr, out_ptr, n_rows, scale, eps,
                     n_channels: tl.constexpr, CHUNK: tl.constexpr, CHUNKS: tl.constexpr, ROWS: tl.constexpr,
                     INPUT_BIAS: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr):
    """The VAE's RMS norm of rows of `n_channels` contiguous values (a channels-last image's pixels), each step
    rounded to the output's dtype where PyTorch's kernels round it: the bias of the convolution before it added if
    INPUT_BIAS, normalized in float32 (F.normalize: x / max(|x|, eps)), times `scale`, times gamma, plus the norm's
    bias, then SiLU if asked (x / (1 + exp(-x))). The channels are read in CHUNKS chunks of CHUNK (a power of two:
    Qwen-Image's 96, 192 and 384 channels are 3 such chunks, unmasked), twice: the second read of a program's few
    kilobytes comes from the cache."""
    dtype = out_ptr.dtype.element_ty
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]
    in_rows = rows < n_rows
    mask_channels: tl.constexpr = CHUNK * CHUNKS != n_channels
    squares = tl.zeros([ROWS], dtype=tl.float32)
    for chunk in tl.static_range(CHUNKS):
        x, channels, _ = _channel_chunk(x_ptr, rows, chunk, in_rows, n_channels, CHUNK, mask_channels)
        x = _biased(x, input_bias_ptr, channels, n_channels, dtype, INPUT_BIAS)
        squares += tl.sum(x * x, axis=1)
    norm = tl.maximum(tl.sqrt_rn(squares), eps)[:, None]
    for chunk in tl.static_range(CHUNKS):
        x, channels, inside = _channel_chunk(x_ptr, rows, chunk, in_rows, n_channels, CHUNK, mask_channels)
        x = _biased(x, input_bias_ptr, channels, n_channels, dtype, INPUT_BIAS)
        values = tl.div_rn(x, norm).to(dtype)
        values = (values.to(tl.float32) * scale).to(dtype)
        gamma = tl.load(gamma_ptr + channels, mask=channels < n_channels).to(tl.float32)
        values = (values.to(tl.float32) * gamma).to(dtype)
        if HAS_BIAS:
            bias = tl.load(bias_ptr + channels, mask=channels < n_channels).to(tl.float32)
            values = (values.to(tl.float32) + bias).to(dtype)
        if SILU:
            values = values.to(tl.float32)
            values = tl.div_rn(values, 1.0 + tl.exp(-values)).to(dtype)
        tl.store(out_ptr + rows * n_channels + channels, values, mask=inside)


@triton.jit
def channel_bias_residual(x_ptr, bias_ptr, residual_ptr, out_ptr, n_values, n_channels: tl.constexpr,
                          BLOCK: tl.constexpr):
    """A residual block's end, on channels-last rows: (x + the convolution's bias per channel) + the residual, each
    addition rounded to the output's dtype as PyTorch's two additions round."""
    dtype = out_ptr.dtype.element_ty
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n_values
    x = tl.load(x_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
    bias = tl.load(bias_ptr + offsets % n_channels, mask=inside, other=0.0).to(tl.float32)
    residual = tl.load(residual_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
    biased = (x + bias).to(dtype).to(tl.float32)
    tl.store(out_ptr + offsets, (biased + residual).to(dtype), mask=inside)


# the kernels' names, as the profiler lists them (lab/probes/profile_dit.py counts them as GhostEdit's)
NAMES = (gelu_rowwise_fp8.__name__, swiglu_rowwise_fp8.__name__, qk_norm_rope_fp8.__name__,
         channel_rms_norm.__name__, channel_bias_residual.__name__)
