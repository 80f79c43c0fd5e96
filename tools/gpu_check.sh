#!/usr/bin/env bash
# Issue #5's GPU checks and figures in one call, for a machine with an NVIDIA GPU (the
# lent device machine: one command, a 10-minute limit, 30 minutes in all; see
# device/METHOD.md "Fit the lease"). Runs, from the repository root:
#   1. the device suites: tests/gpu (allocator, streams, fused kernels) and
#      test_gpu_kernels (every GPU kernel against its CPU twin on fresh random inputs,
#      outputs poisoned first; the seed MLP's step through a session on /gpu:0);
#   2. benchmarks/gpu_elementwise (fused 5-op expression vs device-to-device copy);
#   3. benchmarks/gpu_step (the MLP step, batch 1024, hidden 1024, vs PyTorch eager);
#   4. mnist_replica --num_gpus=1 as 1 ps + 2 workers for a short run (loom-launch).
# Each step's full output goes to $OUT/<step>.log (or ./gpu_check/ without $OUT); a
# table of PASS/FAIL/SKIP lines comes last. The binaries come from BUILD (default
# build-gpuk), built on this machine with CUDA and carried over, or built there with
#   cmake -S . -B build-gpuk -G Ninja -DCMAKE_BUILD_TYPE=Release && ninja -C build-gpuk \
#     test_gpu test_gpu_kernels gpu_elementwise gpu_step mnist_replica loom-launch
# Exit status: 0 when every step that ran passed.
set -u
BUILD=${BUILD:-build-gpuk}
OUT=${OUT:-gpu_check}
mkdir -p "$OUT"
summary=()
status=0

step() { # step NAME COMMAND...: runs it, logs it, records PASS/FAIL/SKIP
  local name=$1
  shift
  if [ ! -x "$1" ]; then
    summary+=("SKIP $name (no $1)")
    return
  fi
  echo "== $name: $*"
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$OUT/$name.log"
  if [ $rc -eq 0 ] && grep -q "no CUDA device" "$OUT/$name.log"; then
    summary+=("SKIP $name (no CUDA device)")
  elif [ $rc -eq 0 ]; then
    summary+=("PASS $name")
  else
    summary+=("FAIL $name (exit $rc)")
    status=1
  fi
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
step gpu_device "$BUILD/tests/gpu/test_gpu" --test-suite=cuda_device
step gpu_kernels_device "$BUILD/tests/gpu/test_gpu_kernels" --test-suite=cuda_device
step gpu_elementwise "$BUILD/benchmarks/gpu_elementwise"
step gpu_step "$BUILD/benchmarks/gpu_step"
if [ -d /usr/share/datasets/fashion-mnist ] || [ -n "${DATA_DIR:-}" ]; then
  step mnist_replica_gpu "$BUILD/tools/loom-launch" --ps 1 --workers 2 -- \
    "$BUILD/examples/mnist_replica" --data_dir "${DATA_DIR:-/usr/share/datasets/fashion-mnist}" \
    --num_gpus 1 --train_steps 2000 --learning_rate 0.001 --log_every 500 \
    --save_checkpoint_secs 0
else
  summary+=("SKIP mnist_replica_gpu (no Fashion-MNIST: set DATA_DIR)")
fi

echo
echo "gpu_check summary ($(date -u +%FT%TZ))"
printf '  %s\n' "${summary[@]}"
exit $status
