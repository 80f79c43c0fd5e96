#!/usr/bin/env bash
# Installs the Debian 12 packages loom needs to build, test, format and run its demo.
# Idempotent: only touches apt when something is missing. Run as root (or with sudo available).
# Set LOOM_SKIP_SETUP=1 to skip it entirely (e.g. on a machine provisioned another way).
set -euo pipefail

packages=(
  build-essential
  g++
  clang
  clang-14
  cmake
  ninja-build
  make
  pkg-config
  libeigen3-dev
  libasio-dev
  libcereal-dev
  doctest-dev
  rapidjson-dev
  zlib1g-dev
  libssl-dev
  libfarmhash-dev
  libjemalloc-dev
  libboost-dev
  libsnappy-dev
  # oneDNN 2.6: the CPU's float convolutions (kernels/cpu/dnnl.hpp); without it they are
  # im2col plus GEMM, 6-7x slower on examples/cnn's shapes
  libdnnl-dev
  libspdlog-dev
  python3-venv
  libbenchmark-dev
  clang-format
  ccache
  dataset-fashion-mnist
  # ctest slurm, mpirun and netns (tests/cluster): a single-node Slurm the test starts
  # itself, mpirun, network namespaces and tc (26 packages, 9.9 MB to download)
  slurmctld
  slurmd
  slurm-client
  munge
  openmpi-bin
  iproute2
)
# `tools/setup.sh --plots` (run by `make plots`) adds what tools/plots.py draws with;
# `make test` and `make demo` do not need it.
if [[ "${1:-}" == "--plots" ]]; then
  packages+=(python3-matplotlib)
fi

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
