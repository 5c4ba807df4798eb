#!/usr/bin/env bash
# Build NVIDIA Transformer Engine's PyTorch binding (transformer_engine_torch; PyPI has only its sdist)
# on a CPU-only x86-64 machine for the GPU machine (Python 3.12, torch 2.11.0+cu130, CUDA 13.0, H100),
# and gather in .whl-te/ every wheel TE needs that the GPU image lacks. A file over 45 MiB (the core
# wheel) is split into parts, one folder .whl-te-partN per transfer. Then run
# scripts/gpu/install_te.sh on the GPU machine.
#
#   scripts/gpu/build_te_wheel.sh          # idempotent: reruns reuse build-te/ (venv, downloads, wheel)
#
# Needs here: pyenv's Python 3.12.1 (or PY=...), nvcc 13.0 (CUDA_HOME), gcc, PyPI.
# Scratch lives in build-te/ and output in .whl-te*/; both are git-ignored: commit only this script.
set -euo pipefail

TE=2.20.2       # transformer-engine, -cu13 and -torch must be the same version
TORCH=2.11.0    # PyPI's default 2.11.0 x86-64 wheel is +cu130: what the GPU image has
SDIST=https://files.pythonhosted.org/packages/3d/fb/c9ce298a38c22ed1059923a01cac7e1f4e4f7281d39a8679c8118febe079/transformer_engine_torch-$TE.tar.gz
SDIST_SHA256=4c40ced8a6261649e689076f198d4feaf02277b1ba18931a66eccdaceb33c43e
# Runtime imports of TE that the GPU image lacks (it has einops, onnx, onnxscript, packaging, pyyaml).
# typing-extensions rides along because pydantic 2.14 needs >=4.16; nvidia-cudnn-frontend is left out:
# TE imports its Python side only lazily, for sm_100 fused kernels.
EXTRAS=(pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5
        typing-extensions==4.16.0 nvdlfw-inspect==0.2.2)
# Build-venv pins; onnx/onnxscript/numpy/einops/pyyaml only mirror the GPU image for the import check.
VENV_PKGS=(torch==$TORCH setuptools==81.0.0 wheel==0.48.0 packaging==26.3 ninja==1.13.2
           einops==0.8.2 pyyaml==6.0.3 numpy==2.5.2 onnx==1.23.1 onnxscript==0.7.2 onnx-ir==1.0.0
           ml-dtypes==0.6.0)
PY=${PY:-$HOME/.pyenv/versions/3.12.1/bin/python}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda-13.0}
PART=$((45 * 1024 * 1024))

root=$(git rev-parse --show-toplevel)
cd "$root"
work=$root/build-te out=$root/.whl-te
mkdir -p "$work/dl"
vpy=$work/venv/bin/python

# 1. Build venv with torch 2.11.0+cu130 and its nvidia-* CUDA 13.0 wheels: their headers (cusparse.h,
#    cublasLt.h, cudnn.h, nccl.h) fill in what a bare nvcc toolkit lacks.
if [[ ! -f $work/venv/.done ]]; then
  rm -rf "$work/venv"
  "$PY" -m venv "$work/venv"
  "$vpy" -m pip install -q "${VENV_PKGS[@]}"   # warnings about /opt/pypi come from this machine's pip config
  touch "$work/venv/.done"
fi
"$vpy" - "$TORCH" <<'EOF'
import sys, torch
assert torch.__version__ == sys.argv[1] + "+cu130" and torch.version.cuda == "13.0", torch.__version__
print("build venv: torch", torch.__version__, "CUDA", torch.version.cuda,
      "CXX11 ABI", torch._C._GLIBCXX_USE_CXX11_ABI, "| python", sys.version.split()[0])
EOF
"$CUDA_HOME/bin/nvcc" --version | grep -q 'release 13.0' || { echo "need nvcc 13.0 in $CUDA_HOME" >&2; exit 1; }

# 2. The binding's sdist, checked against PyPI's hash.
tgz=$work/dl/transformer_engine_torch-$TE.tar.gz
[[ -f $tgz ]] || curl -sSfL -o "$tgz" "$SDIST"
echo "$SDIST_SHA256  $tgz" | sha256sum -c --quiet

# 3. Build the wheel (33 C++ files, no CUDA kernels: 16 min on 2 idle cores, 29 min CPU time).
whl=$(ls "$work"/wheel/transformer_engine_torch-$TE-cp312-cp312-linux_x86_64.whl 2>/dev/null || true)
if [[ -z $whl ]]; then
  rm -rf "$work/src" && mkdir -p "$work/src" && tar -xzf "$tgz" -C "$work/src"  # setup.py deletes files: start fresh
  sp=$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # FORCE_BUILD: else setup.py first tries to fetch a prebuilt wheel from GitHub.
  # NO_LOCAL_VERSION: else the version gets this repo's git hash (+abc123) and TE's import-time
  #   check (binding == core == meta version) fails.
  # CPLUS_INCLUDE_PATH is searched after the -I toolkit dir: the wheels' headers only fill gaps.
  ( cd "$work/src/transformer_engine_torch-$TE" &&
    PATH=$CUDA_HOME/bin:$PATH NVTE_FRAMEWORK=pytorch NVTE_CUDA_ARCHS=90 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=2 \
    NVTE_PYTORCH_FORCE_BUILD=TRUE NVTE_NO_LOCAL_VERSION=1 \
    CPLUS_INCLUDE_PATH=$sp/nvidia/cu13/include:$sp/nvidia/cudnn/include:$sp/nvidia/nccl/include \
    "$vpy" -m pip wheel -q --no-build-isolation --no-deps -w "$work/wheel" . )
  whl=$(ls "$work"/wheel/transformer_engine_torch-$TE-cp312-cp312-linux_x86_64.whl)
fi

# 4. TE's Python package + core library wheels, and the extras, for cp312 manylinux x86-64.
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none)
for n in 17 27 28; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
plat+=(--platform manylinux2014_x86_64 --platform any)
"$vpy" -m pip download -q --no-deps "${plat[@]}" -d "$work/dl" \
  transformer-engine==$TE transformer-engine-cu13==$TE "${EXTRAS[@]}" 2>&1 | grep -v '^WARNING: Location' || true

# 5. Lay out .whl-te (small wheels) and .whl-te-partN (45 MiB parts of the core wheel), from scratch.
rm -rf "$out" "$out"-part*
mkdir -p "$out"
cp "$whl" "$work"/dl/transformer_engine-$TE-py3-none-any.whl "$out/"
for p in "${EXTRAS[@]}"; do
  n=${p%%==*}; v=${p#*==}
  cp "$work"/dl/"${n//-/_}"-"$v"-*.whl "$out/"
done
core=$(ls "$work"/dl/transformer_engine_cu13-$TE-py3-none-manylinux_2_28_x86_64.whl)
(cd "$work/dl" && sha256sum "$(basename "$core")") > "$out/SHA256SUMS"
tmp=$(mktemp -d)
split -b $PART -d "$core" "$tmp/$(basename "$core").part"
parts=("$tmp"/*)
i=0
for p in "${parts[@]}"; do
  i=$((i + 1))
  # The last, smaller part rides with the small wheels when together they stay under 55 MiB.
  if ((i == ${#parts[@]})) && (( $(du -cb "$out" "$p" | tail -1 | cut -f1) < 55 * 1024 * 1024 )); then
    mv "$p" "$out/"
  else
    mkdir -p "$out-part$i" && mv "$p" "$out-part$i/"
  fi
done
rmdir "$tmp"

# 6. Checks possible without a GPU: ABI, linked libraries, glibc symbols, import as far as it goes.
so=$(unzip -Z1 "$whl" | grep '\.so$')
rm -rf "$work/chk" && mkdir -p "$work/chk" && unzip -q -o "$whl" "$so" -d "$work/chk"
echo "== $so: NEEDED"; readelf -d "$work/chk/$so" | awk '/NEEDED/{print "  " $NF}'
echo "== newest GLIBC / GLIBCXX / CXXABI symbol versions it needs (this machine: glibc $(ldd --version | head -1 | awk '{print $NF}'))"
objdump -T "$work/chk/$so" | grep -oE '(GLIBC|GLIBCXX|CXXABI)_[0-9.]+' | sort -uV | awk -F_ '{m[$1]=$0} END{for(k in m) print "  " m[k]}'
echo "== C++11 ABI: __cxx11 symbols in the .so: $(nm -D "$work/chk/$so" | grep -c __cxx11 || true)"
rm -rf "$work/site"
"$vpy" -m pip install -q --no-index --no-deps --no-compile --target "$work/site" "$out"/*.whl "$core"
echo "== import check without a GPU (torch must be imported first: it loads libnccl, which the core lib needs):"
nm -D --undefined-only "$work/chk/$so" | awk '$1 == "U" {print $2}' > "$work/chk/undefined.txt"
PYTHONPATH=$work/site "$vpy" -c '
import ctypes, sys, torch, transformer_engine, transformer_engine.pytorch as te
import transformer_engine_torch as tex
print("import ok: TE", transformer_engine.__version__, "from", transformer_engine.__file__, "| cuDNN", tex.get_cudnn_version())
# Every symbol the binding imports must be defined by a library now loaded (torch, TE core, CUDA):
# a torch ABI or version mismatch shows up here, not only at the first call.
handles = []
for p in sorted({l.split()[-1] for l in open("/proc/self/maps") if ".so" in l.split()[-1]}):
    try: handles.append(ctypes.CDLL(p))
    except OSError: pass
syms = open(sys.argv[1]).read().split()
missing = [s for s in syms if not any(hasattr(h, s.split("@")[0]) for h in handles)]
print(len(syms), "symbols imported by the binding, unresolved:", missing or "none")
sys.exit(1 if missing else 0)
' "$work/chk/undefined.txt" 2>&1 | sed 's/^/  /'

echo
echo "Wheels in $out: $(ls "$out" | wc -l) files, $(du -sh "$out" | cut -f1); parts of the core wheel:"
ls -1 "$out"-part*/* "$out"/*.part* 2>/dev/null | sed 's/^/  /'
nparts=$(ls -d "$out"-part* 2>/dev/null | wc -l)
echo "Transfers to the GPU machine (one device call each, back to back so that it stays warm):"
for i in $(seq 1 "$nparts"); do
  echo "  $i: carry .whl-te-part$i; run: mkdir -p /tmp/parts && cp .whl-te-part$i/* /tmp/parts/"
done
echo "  $((nparts + 1)): carry .whl-te; run: bash scripts/gpu/install_te.sh"
