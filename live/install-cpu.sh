#!/usr/bin/env bash
# One command for prism's CPU live environment: SGLang 0.5.23 on the CPU engine, no GPU, no model hub.
#
#   bash live/install-cpu.sh VENV          # creates VENV, or updates it in place (idempotent)
#
# What it does, in order:
#   1. python3 -m venv VENV (the current python3; 3.11 is what was checked).
#   2. torch==2.14.1 and torchvision==0.29.1: the versions sglang 0.5.23 pins (torch==2.14.1) and the highest the
#      machine's pip constraints allow (torch<=2.14.1, torchvision<=0.29.1). They are the plain PyPI wheels,
#      which run on the CPU (no GPU needed) but pull in the CUDA runtime wheels (nvidia-*, triton): that is most
#      of the size. The smaller torch 2.13.0+cpu wheel is not used: sglang 0.5.23 pins torch 2.14.1 and no CPU
#      torchvision build for 2.13 is on the indexes (the PyPI torchvision is built against CUDA torch).
#   3. pip install --no-deps sglang==0.5.23 (its full Requires-Dist is GPU kernels: flashinfer, sglang-kernel...).
#   4. pip install -r live/requirements-cpu.txt: the Python modules the scheduler and the HTTP server import
#      (with prometheus_client for the plugin's gauges and sglang-router 0.3.2 for --router sglang_router),
#      pinned where sglang 0.5.23's METADATA pins them.
#   5. pip install -e REPO pytest hypothesis (REPO = this script's folder's parent).
#   6. An import stand-in for sgl_kernel (no CPU build is published), written into VENV's site-packages only:
#      a single-file module, not a package, so `import sgl_kernel` works, every `sgl_kernel.NAME` is a function
#      that raises NotImplementedError when called, `import sgl_kernel.sub` / `from sgl_kernel.sub import x`
#      raise ModuleNotFoundError, and no torch.ops.sgl_kernel.* op is registered (SGLang's CPU checks
#      `hasattr(torch.ops.sgl_kernel, "convert_weight_packed")` then say "no AMX kernels", the native path runs).
#   7. An import check, then the venv's python path is printed (last line of stdout).
#
# Size and time (measured on the 2-core dev machine, shared, indexes on local disk): 6.4 GB (nvidia/ 3.2 GB,
# torch/ 1.2 GB, triton/ 0.9 GB); a fresh venv 126-217 s, a re-run on an existing venv 27 s; pip peaks at ~1 GB RSS.
# Then run the server with SGLANG_USE_CPU_ENGINE=1 OMP_NUM_THREADS=1 ... --device cpu --attention-backend
# torch_native --max-total-tokens N (DESIGN §6, "CPU").
set -euo pipefail

if [[ $# -ne 1 || -z "$1" ]]; then
    echo "usage: $0 VENV" >&2
    exit 2
fi
VENV=$1
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
REQS="$HERE/requirements-cpu.txt"

TORCH_VERSION=2.14.1
TORCHVISION_VERSION=0.29.1
SGLANG_VERSION=0.5.23

log() { echo "[install-cpu] $*" >&2; }

if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating venv $VENV with $(command -v python3) ($(python3 --version 2>&1))"
    python3 -m venv "$VENV"
else
    log "updating existing venv $VENV"
fi
PY="$VENV/bin/python"
# pip reports sglang's own GPU requirements (flashinfer, sglang-kernel, ...) as "dependency conflicts" after each
# step, since sglang is installed with --no-deps: expected, so those lines are filtered out; anything else shows.
pip_install() {
    "$PY" -m pip install --quiet --disable-pip-version-check "$@" 2>&1 \
        | { grep -v -E "^sglang $SGLANG_VERSION requires |^ERROR: pip's dependency resolver does not currently" || true; } >&2
}

log "1/5 torch==$TORCH_VERSION torchvision==$TORCHVISION_VERSION"
pip_install "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"

log "2/5 sglang==$SGLANG_VERSION (--no-deps)"
pip_install --no-deps "sglang==$SGLANG_VERSION"

log "3/5 sglang's Python needs ($REQS)"
# torch/torchvision repeated so that nothing in the list can move them.
pip_install -r "$REQS" "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"

log "4/5 prism (-e $REPO), pytest, hypothesis"
pip_install -e "$REPO" pytest hypothesis "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"

log "5/5 sgl_kernel import stand-in"
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# Clear anything a real sgl_kernel / an older stand-in left, so that the module below is what imports.
rm -rf "$SITE/sgl_kernel" "$SITE"/sgl_kernel-*.dist-info "$SITE"/sglang_kernel-*.dist-info
cat > "$SITE/sgl_kernel.py" <<'EOF'
"""Import stand-in for sgl_kernel in a CPU venv (written by prism's live/install-cpu.sh; no CPU build exists).

`import sgl_kernel` succeeds; any public attribute is a function that raises NotImplementedError when called.
This is a plain module, not a package: `import sgl_kernel.x` raises ModuleNotFoundError. It registers no
torch.ops.sgl_kernel operators, so SGLang's CPU engine takes its native (non-AMX) path.
"""

PRISM_STUB = True


def __getattr__(name):
    # Dunders (__path__, __version__, __file__ lookups...) stay missing: the import system must not take this
    # module for a package, and version checks must not see a version.
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)

    def _unavailable(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name}: sgl_kernel is a CPU import stand-in here (prism live/install-cpu.sh); "
            "this code path needs the real GPU kernels"
        )

    _unavailable.__name__ = _unavailable.__qualname__ = name
    return _unavailable
EOF

log "import check"
SGLANG_USE_CPU_ENGINE=1 "$PY" - <<'EOF'
import importlib, sys
import torch, torchvision, sgl_kernel
import sglang.srt.managers.schedule_policy, sglang.srt.managers.scheduler, sglang.launch_server  # noqa: F401
import prism.live.sglang_objects  # noqa: F401
try:
    importlib.import_module("sgl_kernel.ops")
except ImportError:
    pass
else:
    raise SystemExit("sgl_kernel stand-in: a submodule imported")
try:
    sgl_kernel.silu_and_mul(None)
except NotImplementedError:
    pass
else:
    raise SystemExit("sgl_kernel stand-in: a kernel call did not raise")
assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed")
import sglang
print(f"[install-cpu] ok: torch {torch.__version__}, torchvision {torchvision.__version__}, sglang {sglang.__version__}",
      file=sys.stderr)
EOF

echo "$PY"
