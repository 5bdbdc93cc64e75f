# Sourced by scripts/device_check.sh and benchmarks/gpu.sh on a GPU machine,
# from the repository root: $OUT for logs, Keras and KerasHub from wheels in
# .whl/ where that Python lacks them (installed to /tmp/site), quiet
# TensorFlow logs, JAX and PyTorch sharing the GPU, and the GPU's name.
OUT=${OUT:-device_out}
mkdir -p "$OUT"
if [ -d .whl ]; then
    [ -d /tmp/site/keras ] || python3 -m pip install -q --no-index --no-deps \
        --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # several processes share the GPU
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
