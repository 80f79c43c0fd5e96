#!/usr/bin/env bash
# Issue #5's GPU checks and figures in one call, for a machine with an NVIDIA GPU (the
# lent device machine: one command, a 10-minute limit, 30 minutes in all; see
# device/METHOD.md "Fit the lease"). Runs, from the repository root:
#   1. the device suites: tests/gpu (allocator, streams, fused kernels) and
#      test_gpu_kernels (every GPU kernel against its CPU twin on fresh random inputs,
#      outputs poisoned first; the seed MLP's step through a session on /gpu:0);
#   2. benchmarks/gpu_elementwise (fused 5-op expression vs device-to-device copy);
#   3. benchmarks/gpu_step (the MLP step, batch 1024, hidden 1024, vs PyTorch eager);
#   4. mnist_replica --num_gpus=1 and examples/cnn --num_gpus=1 as 1 ps + 2 workers for a
#      short run each (loom-launch); examples/ctr as 1 ps + 2 workers twice, its workers on
#      their CPUs and then on the GPU (--num_gpus=1), for examples/s and AUC side by side;
#   5. benchmarks/conv2d --gpu (conv2d and its gradients vs PyTorch's cuDNN);
#   6. compute-sanitizer over test_gpu_kernels's device suite: memcheck (out-of-bounds
#      and misaligned accesses, API errors) and racecheck (shared-memory hazards, warnings
#      included: a warp-synchronous read and write without __syncwarp is one).
# Each step's full output goes to $OUT/<step>.log (or ./gpu_check/ without $OUT); a
# table of PASS/FAIL/SKIP lines comes last. Exit status: 0 when every step that ran passed.
# ONLY="step ..." runs those steps alone (a short call for one figure).
#
# The binaries come from BUILD (default build-gpu). The device machine's image has CUDA
# but not loom's Debian packages (Eigen, Asio, cereal, doctest), so build them here and
# carry them:
#   tools/gpu_check.sh bundle     # here: builds them in build/, packs them stripped, with
#                                 # Fashion-MNIST, into build-gpu/ (about 40 MB)
#   device: command "tools/gpu_check.sh", carry ["build-gpu"]
# build-gpu/fashion-mnist is the data of step 4 unless DATA_DIR names another.
set -u
BUILD=${BUILD:-build-gpu}
OUT=${OUT:-gpu_check}
binaries=(tests/gpu/test_gpu tests/gpu/test_gpu_kernels benchmarks/gpu_elementwise
  benchmarks/gpu_step benchmarks/conv2d examples/mnist_replica examples/cnn examples/ctr
  tools/loom-launch)

if [ "${1:-}" = bundle ]; then
  set -e
  cmake --preset default >/dev/null
  targets=()
  for b in "${binaries[@]}"; do targets+=("$(basename "$b")"); done
  cmake --build build --target "${targets[@]}"
  rm -rf "$BUILD"
  for b in "${binaries[@]}"; do
    mkdir -p "$BUILD/$(dirname "$b")"
    strip -o "$BUILD/$b" "build/$b"
  done
  # oneDNN (the CPU's convolutions) is a shared library only, and the image has no
  # libdnnl-dev: its library and what it loads (OpenMP, the OpenCL loader) go in lib/.
  mkdir -p "$BUILD/lib"
  ldd build/benchmarks/gpu_step | awk '/lib(dnnl|gomp|OpenCL)\.so/ { print $3 }' |
    while read -r lib; do cp -L "$lib" "$BUILD/lib/"; done
  # Packed: the stripped binaries are 32 MB, Fashion-MNIST 30 MB and the tree 4 MB, at
  # the 64 MiB a call may carry; xz makes the binaries about a quarter of that.
  tar -C "$BUILD" -cJf "$BUILD/binaries.tar.xz" "${binaries[@]}" lib
  (cd "$BUILD" && rm -rf "${binaries[@]}" lib)
  cp -r /usr/share/datasets/fashion-mnist "$BUILD/fashion-mnist"
  du -sh "$BUILD"
  exit 0
fi
if [ -f "$BUILD/binaries.tar.xz" ]; then
  tar -C "$BUILD" -xJf "$BUILD/binaries.tar.xz"
fi
if [ -z "${DATA_DIR:-}" ] && [ -d "$BUILD/fashion-mnist" ]; then
  DATA_DIR=$BUILD/fashion-mnist
fi
mkdir -p "$OUT"
summary=()
status=0

step() { # step NAME COMMAND...: runs it, logs it, records PASS/FAIL/SKIP
  local name=$1
  shift
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then
    summary+=("SKIP $name (not in ONLY)")
    return
  fi
  if [ ! -x "$1" ]; then
    summary+=("SKIP $name (no $1)")
    return
  fi
  echo "== $name: $*"
  # Each step is bounded, so that one hung kernel still leaves the table (and the lease).
  timeout "${STEP_TIMEOUT:-150}" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$OUT/$name.log"
  if [ $rc -eq 0 ] && grep -q "no CUDA device" "$OUT/$name.log"; then
    summary+=("SKIP $name (no CUDA device)")
  elif [ $rc -eq 124 ]; then
    summary+=("FAIL $name (timed out after ${STEP_TIMEOUT:-150} s)")
    status=1
  elif [ $rc -eq 0 ]; then
    summary+=("PASS $name")
  else
    summary+=("FAIL $name (exit $rc)")
    status=1
  fi
}

# The CUDA runtime and cuBLAS of the image's toolkit; oneDNN's libraries carried in lib/.
if [ -d /usr/local/cuda/lib64 ]; then
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
if [ -d "$BUILD/lib" ]; then
  export LD_LIBRARY_PATH=$PWD/$BUILD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
# Binaries built on another image: say which shared libraries this one lacks. (One file
# with the GPU's name: a call brings back 8 files.)
for b in "${binaries[@]}"; do
  [ -x "$BUILD/$b" ] && ldd "$BUILD/$b" 2>&1 | sed "s|^|$b: |"
done >>"$OUT/gpu.txt"
grep "not found" "$OUT/gpu.txt" || true
step gpu_device "$BUILD/tests/gpu/test_gpu" --test-suite=cuda_device
step gpu_kernels_device "$BUILD/tests/gpu/test_gpu_kernels" --test-suite=cuda_device
step gpu_elementwise "$BUILD/benchmarks/gpu_elementwise"
step gpu_step "$BUILD/benchmarks/gpu_step" --torch_step benchmarks/gpu_step/torch_step.py
if ! nvidia-smi -L >/dev/null 2>&1; then
  summary+=("SKIP mnist_replica_gpu (no GPU: nvidia-smi lists none)")
elif [ -d /usr/share/datasets/fashion-mnist ] || [ -n "${DATA_DIR:-}" ]; then
  step mnist_replica_gpu "$BUILD/tools/loom-launch" --ps 1 --workers 2 -- \
    "$BUILD/examples/mnist_replica" --data_dir "${DATA_DIR:-/usr/share/datasets/fashion-mnist}" \
    --num_gpus 1 --train_steps 2000 --learning_rate 0.001 --log_every 500 \
    --save_checkpoint_secs 0
  step cnn_gpu "$BUILD/tools/loom-launch" --ps 1 --workers 2 -- \
    "$BUILD/examples/cnn" --data_dir "${DATA_DIR:-/usr/share/datasets/fashion-mnist}" \
    --num_gpus 1 --train_steps 2000 --log_every 500
else
  summary+=("SKIP mnist_replica_gpu, cnn_gpu (no Fashion-MNIST: set DATA_DIR)")
fi
# The click model, its workers' dense networks on their CPUs and then on the GPU: the
# same data, steps and seed, so examples/s and AUC compare.
if nvidia-smi -L >/dev/null 2>&1; then
  for gpus in 0 1; do
    step "ctr_gpus_$gpus" "$BUILD/tools/loom-launch" --ps 1 --workers 2 -- \
      "$BUILD/examples/ctr" --num_gpus "$gpus" --train_steps 2000 --log_every 1000 \
      --save_checkpoint_secs 0
  done
else
  summary+=("SKIP ctr_gpus_0, ctr_gpus_1 (no GPU: nvidia-smi lists none)")
fi
step conv2d_gpu "$BUILD/benchmarks/conv2d" --gpu --reps 50
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ ! -x "$sanitizer" ]; then
  summary+=("SKIP memcheck, racecheck (no compute-sanitizer)")
elif [ ! -x "$BUILD/tests/gpu/test_gpu_kernels" ]; then
  summary+=("SKIP memcheck, racecheck (no $BUILD/tests/gpu/test_gpu_kernels)")
else
  # --error-exitcode makes a finding fail the step (the sanitizer otherwise returns the
  # program's status).
  step memcheck "$sanitizer" --tool memcheck --error-exitcode 99 \
    "$BUILD/tests/gpu/test_gpu_kernels" --test-suite=cuda_device
  step racecheck "$sanitizer" --tool racecheck --error-exitcode 98 --print-limit 1000 \
    "$BUILD/tests/gpu/test_gpu_kernels" --test-suite=cuda_device
  # Hazards reported as warnings leave the exit status 0: the summary line decides, and
  # replaces the step's own line.
  if grep -q "RACECHECK SUMMARY: [1-9]" "$OUT/racecheck.log" 2>/dev/null; then
    summary[${#summary[@]}-1]="FAIL racecheck ($(grep -m1 'RACECHECK SUMMARY' "$OUT/racecheck.log"))"
    status=1
  fi
fi

echo
echo "gpu_check summary ($(date -u +%FT%TZ))"
printf '  %s\n' "${summary[@]}"
exit $status
