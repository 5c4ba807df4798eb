#!/usr/bin/env bash
# Build FlashAttention-3 (flash_attn_3, the `fa3` and `fa3-fp8` attention backends) on a CPU-only x86-64 machine
# for the GPU machine: the package index has no wheel of it. Only what GhostEdit's DiT runs is compiled (forward,
# head dim 128, bf16 and FP8 e4m3, Hopper sm_90a, no split/paged/varlen/softcap/local variants): two kernel files,
# about 3 minutes on 2 cores. The wheel is abi3 against torch's stable ABI (torch >= 2.9), so it installs on the GPU
# machine's Python 3.12 though built with another; it lands in .whl-fa3/ (1.4 MB), a folder of its own: with
# FlashAttention-3 installed DiffSynth's default attention (and so `exact`) runs it, so only runs that carry the folder
# get it (carry [".whl", ".whl-fa3"], then cp .whl-fa3/*.whl /tmp/wheels/ as well).
#
#   FA_SRC=DIR scripts/gpu/build_fa3_wheel.sh
#
# FA_SRC: a flash-attention source tree at FA_COMMIT with its csrc/cutlass submodule at CUTLASS_COMMIT, e.g.
#   git clone https://github.com/Dao-AILab/flash-attention && git -C flash-attention checkout $FA_COMMIT &&
#   git -C flash-attention submodule update --init csrc/cutlass
# (only hopper/, README.md and csrc/cutlass/include are read). The CUDA 13.0 toolchain comes from the package index
# (nvcc, its headers and NVVM, pinned to the CUDA torch 2.11 was built with); torch itself from $PYTHON
# (default: the project's .venv, torch 2.11.0+cu130 as the README installs it). Scratch lives in build-fa3/
# (git-ignored): commit only this script.
set -euo pipefail

FA_COMMIT=0251105a2fb19d2957484b7f023cd8c115286ced      # flash-attention main, 2026-08-15
CUTLASS_COMMIT=7127592069c2fe01b041e174ba4345ef9b279671  # its csrc/cutlass submodule at that commit
# nvidia-nvvm is pinned too: unpinned, pip takes the newest, whose PTX the 13.0 ptxas refuses
TOOLCHAIN=(nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-cccl==13.0.85
           nvidia-cuda-runtime==13.0.96)
BUILD_TOOLS=("setuptools<82" wheel==0.48.0 ninja==1.13.2 packaging)  # torch 2.11 requires setuptools < 82
DISABLED=(BACKWARD SPLIT PAGEDKV APPENDKV LOCAL SOFTCAP PACKGQA FP16 VARLEN CLUSTER HDIM64 HDIM96 HDIM192 HDIM256
          SM80 HDIMDIFF64 HDIMDIFF192)

root=$(git rev-parse --show-toplevel)
cd "$root"
PYTHON=${PYTHON:-$root/.venv/bin/python}
src=${FA_SRC:?set FA_SRC to a flash-attention tree at $FA_COMMIT with csrc/cutlass}
[[ -d $src/hopper && -d $src/csrc/cutlass/include/cute ]] || { echo "$src lacks hopper/ or csrc/cutlass" >&2; exit 1; }
if git -C "$src" rev-parse HEAD >/dev/null 2>&1; then
  [[ $(git -C "$src" rev-parse HEAD) == "$FA_COMMIT" ]] || { echo "$src is not at $FA_COMMIT" >&2; exit 1; }
fi
"$PYTHON" -c 'import torch; assert torch.__version__.startswith("2.11") and torch.version.cuda == "13.0", torch.__version__'

work=$root/build-fa3
cuda=$work/cuda/nvidia/cu13
# 1. The toolchain, laid out as a CUDA_HOME: torch's extension builder wants bin/nvcc, include/ and lib64/
if [[ ! -f $work/cuda/.done ]]; then
  rm -rf "$work/cuda"
  "$PYTHON" -m pip install -q --target "$work/cuda" "${TOOLCHAIN[@]}" 2>&1 | grep -v '^WARNING: Location' || true
  ln -sfn lib "$cuda/lib64"
  ln -sf libcudart.so.13 "$cuda/lib/libcudart.so"
  # cuBLAS, cuSPARSE and the other headers torch's own includes name come from torch's nvidia-* wheels
  torch_cuda=$("$PYTHON" -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13", "include"))')
  for header in "$torch_cuda"/*; do
    [[ -e $cuda/include/$(basename "$header") ]] || ln -s "$header" "$cuda/include/"
  done
  touch "$work/cuda/.done"
fi
"$cuda/bin/nvcc" --version | grep -q 'release 13.0' || { echo "nvcc 13.0 missing in $cuda" >&2; exit 1; }
[[ -d $work/tools/ninja ]] || "$PYTHON" -m pip install -q --target "$work/tools" "${BUILD_TOOLS[@]}" 2>&1 |
  grep -v '^WARNING: Location\|dependency conflicts\|requires setuptools' || true

# 2. A fresh copy of the sources (the build writes into them), then the wheel
rm -rf "$work/src" && mkdir -p "$work/src/csrc"
cp -r "$src/hopper" "$src/README.md" "$work/src/" && cp -r "$src/csrc/cutlass" "$work/src/csrc/"
rm -rf "$work/src/hopper/build" "$work/src/hopper/dist"  # a build left in the tree would be reused
for flag in "${DISABLED[@]}"; do export "FLASH_ATTENTION_DISABLE_$flag=TRUE"; done
( cd "$work/src/hopper" &&
  CUDA_HOME=$cuda PATH=$cuda/bin:$work/tools/bin:$PATH PYTHONPATH=$work/tools \
  FLASH_ATTENTION_FORCE_BUILD=TRUE FLASH_ATTENTION_OFFLINE_BUILD=1 MAX_JOBS=2 NVCC_THREADS=1 \
  "$PYTHON" setup.py -q bdist_wheel > "$work/build.log" 2>&1 ) || { tail -n 30 "$work/build.log" >&2; exit 1; }
wheel=$(ls "$work"/src/hopper/dist/flash_attn_3-*-cp310-abi3-linux_x86_64.whl)

# 3. Checks possible without a GPU: the FP8 kernels are in it, and it imports beside torch
grep -q 'float_e4m3' "$work/build.log" || { echo "no FP8 kernel was compiled" >&2; exit 1; }
rm -rf "$work/site" && "$PYTHON" -m pip install -q --no-index --no-deps --target "$work/site" "$wheel"
PYTHONPATH=$work/site "$PYTHON" -c 'import torch, flash_attn_interface, flash_attn_config as c
assert not c.CONFIG["build_flags"]["FLASHATTENTION_DISABLE_FP8"]; print("imports:", flash_attn_interface.__file__)'
rm -rf .whl-fa3 && mkdir -p .whl-fa3 && cp "$wheel" .whl-fa3/
echo "built $(basename "$wheel") into .whl-fa3/"
