# Setup for mlamem on a GPU machine, in the repo root. scripts/gpu_check.py runs its commands in
# the environment this leaves; by hand, before running mlamem there: `source scripts/gpu-env.sh`.
#
# 1. Installs the wheels in .whl/ and this checkout into $MLAMEM_SITE (default /tmp/site),
#    without dependencies or network: the machine's python3 brings torch, typer, rich, pandas
#    and nvidia-ml-py. .whl/ (kept out of git) carries FlashMLA, downloaded where an index is
#    reachable, for the GPU machine's CPython 3.12:
#        python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#            --implementation cp --platform manylinux2014_x86_64 -d .whl sgl-flash-mla==1.0.0
# 2. Exports PYTHONPATH=$MLAMEM_SITE and PYTHONSAFEPATH=1. The checkout's mlamem/ folder is not
#    the whole package (kernels/ and scenarios/ sit at the top of the repo and are installed as
#    mlamem.kernels and mlamem.scenarios), so no python3 may import mlamem from the working
#    directory: PYTHONSAFEPATH keeps `python3 -m ...` from putting it first on sys.path, here
#    and in the processes mlamem starts (repro-oom's cases).
# Returns non-zero when the installed package cannot be imported.
MLAMEM_SITE=${MLAMEM_SITE:-/tmp/site}

_mlamem_pip_target() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$MLAMEM_SITE" "$@"
}

_mlamem_wheels=(.whl/*.whl)
if [ -e "${_mlamem_wheels[0]}" ]; then
    _mlamem_pip_target "${_mlamem_wheels[@]}" || return 1
else
    echo "gpu-env.sh: no wheels in .whl/; FlashMLA only if python3 already has it" >&2
fi
unset _mlamem_wheels

# The checkout, built by the machine's own setuptools (pyproject.toml asks for >= 77). Where that
# fails, copy the three packages the way pyproject.toml's package-dir maps them.
if ! _mlamem_pip_target --no-build-isolation . >/tmp/mlamem-pip-install.log 2>&1; then
    echo "gpu-env.sh: pip could not build the checkout (last line: $(tail -n 1 \
/tmp/mlamem-pip-install.log)); copying mlamem/, kernels/ and scenarios/ into $MLAMEM_SITE" >&2
    rm -rf "$MLAMEM_SITE/mlamem" && mkdir -p "$MLAMEM_SITE" \
        && cp -r mlamem "$MLAMEM_SITE/mlamem" && cp -r kernels "$MLAMEM_SITE/mlamem/kernels" \
        && cp -r scenarios "$MLAMEM_SITE/mlamem/scenarios" || return 1
fi

# vLLM's FlashMLA build (kernels/flashmla_vllm.py), when its libraries were taken out of the
# vllm wheel into .whl/vllm/ (see the README)
if [ -z "${MLAMEM_VLLM_FLASHMLA:-}" ] && [ -f .whl/vllm/_flashmla_C.abi3.so ]; then
    export MLAMEM_VLLM_FLASHMLA=$PWD/.whl/vllm
fi
# FlashInfer (kernels/flashinfer_mla.py), when its wheels were downloaded into .whl/flashinfer/
# (flashinfer-python and what it imports that the machine lacks: apache-tvm-ffi, ninja,
# requests, tqdm, ...): installed into a folder of its own, after the checkout on the path. Its
# MLA kernels JIT-compile with nvcc into FLASHINFER_WORKSPACE_BASE unless the wheel brings them
# compiled.
_mlamem_fi_site=
_mlamem_fi_wheels=(.whl/flashinfer/*.whl)
if [ -e "${_mlamem_fi_wheels[0]}" ]; then
    _mlamem_fi_site=$MLAMEM_SITE-flashinfer
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$_mlamem_fi_site" "${_mlamem_fi_wheels[@]}" || return 1
    export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fiws}
    export PATH=$_mlamem_fi_site/bin:$PATH  # ninja, for a JIT compile
fi
unset _mlamem_fi_wheels
export PYTHONPATH=$MLAMEM_SITE${_mlamem_fi_site:+:$_mlamem_fi_site}${PYTHONPATH:+:$PYTHONPATH} PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1
unset _mlamem_fi_site
python3 -c "import mlamem.kernels, mlamem.scenarios" || return 1
