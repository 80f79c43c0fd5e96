#!/usr/bin/env bash
# Installs the Debian 12 packages loom needs to build and run its demo (no option), to
# build and run its tests (--test; --test-build: only what building them needs), or to draw
# its plots (--plots).
# Idempotent: only touches apt when something is missing. Run as root (or with sudo available).
# Set LOOM_SKIP_SETUP=1 to skip it entirely (e.g. on a machine provisioned another way).
set -euo pipefail

# What `make demo` needs (the default): the compilers, the libraries and the dataset, and
# doctest, which configuring the tree needs. Nothing here starts a service.
packages=(
  build-essential
  g++
  cmake
  ninja-build
  make
  libeigen3-dev
  libasio-dev
  libcereal-dev
  doctest-dev
  rapidjson-dev
  zlib1g-dev
  libssl-dev
  libfarmhash-dev
  libjemalloc-dev
  libsnappy-dev
  # oneDNN 2.6: the CPU's float convolutions (kernels/cpu/dnnl.hpp); without it they are
  # im2col plus GEMM, 6-7x slower on examples/cnn's shapes
  libdnnl-dev
  libspdlog-dev
  dataset-fashion-mnist
)
# `tools/setup.sh --test` (run by `make test`) adds what only the tests and benchmarks use:
# clang (the header checks and the install tests), pkg-config (the install test reads
# loom.pc), clang-format, ccache, Google Benchmark, python3 (the docs' snippet check) and
# python3-venv (TensorBoard's environment),
# a headless Chromium (the TensorBoard page check), and for the tests that run real
# launchers a single-node Slurm the test starts itself, mpirun, network namespaces and tc.
# `make test` runs `--test-build` (what the build itself uses) first and `--test` beside the
# build: the rest is only run by the tests.
# `tools/setup.sh --plots` (run by `make plots`) adds what tools/plots.py draws with.
test_build_packages=(
  clang
  clang-14
  pkg-config
  clang-format
  ccache
  libbenchmark-dev
  python3
)
case "${1:-}" in
  "") ;;
  --test-build) packages+=("${test_build_packages[@]}") ;;
  --test)
    packages+=(
      "${test_build_packages[@]}"
      python3-venv
      chromium-headless-shell
      slurmctld
      slurmd
      slurm-client
      munge
      openmpi-bin
      iproute2
    )
    ;;
  --plots) packages+=(python3-matplotlib) ;;
  *)
    echo "setup: unknown option '$1' (none: the demo's packages; --test: also the tests';" \
         "--test-build: only what building the tests needs; --plots: also tools/plots.py's)" >&2
    exit 2
    ;;
esac

if [[ "${LOOM_SKIP_SETUP:-0}" == "1" ]]; then
  echo "setup: skipped (LOOM_SKIP_SETUP=1)"
  exit 0
fi

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "setup: dpkg-query not found; tools/setup.sh supports Debian 12 only." \
       "Install the equivalents of: ${packages[*]} (or set LOOM_SKIP_SETUP=1)" >&2
  exit 1
fi

is_installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}

missing=()
for p in "${packages[@]}"; do
  is_installed "$p" || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  echo "setup: all packages present"
  exit 0
fi

if [[ "$(id -u)" -eq 0 ]]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)
else
  echo "setup: missing packages: ${missing[*]}; run tools/setup.sh as root" \
       "(sudo is not available), or install them yourself" >&2
  exit 1
fi

log="$(mktemp -t loom-setup.XXXXXX.log)"
if ! "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update >"$log" 2>&1 ||
   ! "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
       apt-get install -y --no-install-recommends "${missing[@]}" >>"$log" 2>&1; then
  cat "$log" >&2
  echo "setup: apt-get failed while installing: ${missing[*]} (log: $log)" >&2
  exit 1
fi

still_missing=()
for p in "${missing[@]}"; do
  is_installed "$p" || still_missing+=("$p")
done
if ((${#still_missing[@]} != 0)); then
  echo "setup: still missing after apt-get: ${still_missing[*]} (log: $log)" >&2
  exit 1
fi

rm -f "$log"
echo "setup: installed ${missing[*]}"
