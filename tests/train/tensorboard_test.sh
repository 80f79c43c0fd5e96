#!/usr/bin/env bash
# loom's event files read by TensorBoard itself (CTest: tensorboard, label
# tensorboard). Runs test_tensorboard_run (a short training run writing
# summaries), then tensorboard_check.py inside a virtual environment that holds
# TensorBoard from PyPI: TensorBoard's EventAccumulator must return every
# scalar at the steps and with the values the run logged, and the histograms
# with their counts; then TensorBoard serves the files and a headless Chromium
# must show loom's tags on its page (and takes the screenshot of
# docs/observability.md).
#
# The environment is made once, under the build directory, and reused. PyPI
# is used only to make it: where it does not exist yet and PyPI cannot be
# reached, the test is skipped (exit 77) saying so, never passed. A run
# without Chromium checks the reader and skips the page, saying so (exit 77).
#
# Usage: tensorboard_test.sh <test_tensorboard_run> <work dir> [<screenshot path>]
set -uo pipefail

run_bin="$1"
work="$2"
screenshot="${3:-}"
here="$(cd "$(dirname "$0")" && pwd)"
venv="$work/tensorboard-venv"
skip=77

if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import tensorboard" 2>/dev/null; then
  if ! python3 -c "import venv, ensurepip" 2>/dev/null; then
    echo "SKIP: python3 has no venv/ensurepip module (Debian: python3-venv), so no environment" \
         "for TensorBoard can be made"
    exit $skip
  fi
  rm -rf "$venv"
  python3 -m venv "$venv" || { echo "FAIL: python3 -m venv $venv failed"; exit 1; }
  # Whether PyPI answers, asked through pip's own configured index.
  if ! "$venv/bin/python" -m pip index versions tensorboard --timeout 10 --retries 1 \
       >"$work/pip-index.log" 2>&1; then
    echo "SKIP: PyPI cannot be reached (pip index versions tensorboard failed:" \
         "$(tail -n 1 "$work/pip-index.log")); TensorBoard cannot be installed into $venv"
    rm -rf "$venv"
    exit $skip
  fi
  echo "installing TensorBoard from PyPI into $venv (once; later runs reuse it)"
  if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --timeout 60 \
       tensorboard >"$work/pip-install.log" 2>&1; then
    cat "$work/pip-install.log"
    echo "FAIL: PyPI answers, but pip install tensorboard failed (log above)"
    rm -rf "$venv"
    exit 1
  fi
fi

run_dir="$work/tensorboard-run"
rm -rf "$run_dir"
mkdir -p "$run_dir/logs"
if ! "$run_bin" "$run_dir/logs" "$run_dir" >"$run_dir/run.log" 2>&1; then
  cat "$run_dir/run.log"
  echo "FAIL: the training run failed (log above)"
  exit 1
fi

chromium=""
for c in chromium chromium-headless-shell chromium-browser; do
  if command -v "$c" >/dev/null 2>&1; then
    chromium="$(command -v "$c")"
    break
  fi
done
exec "$venv/bin/python" "$here/tensorboard_check.py" --logdir "$run_dir/logs" \
  --expected "$run_dir/expected.tsv" --chromium "$chromium" --screenshot "$screenshot" \
  --work "$run_dir"
