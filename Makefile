# Thin wrapper over CMake presets. `make test` is all CI runs (.ci/run).
#   make setup | build | test | demo | bench | plots | format | clean
# PRESET=clang or PRESET=debug selects another preset (build dirs build-clang/, build-debug/).

PRESET ?= default
ifeq ($(PRESET),default)
BUILD_DIR := build
else
BUILD_DIR := build-$(PRESET)
endif

# Two cores by default; override with CMAKE_BUILD_PARALLEL_LEVEL=N make ...
CMAKE_BUILD_PARALLEL_LEVEL ?= 2
export CMAKE_BUILD_PARALLEL_LEVEL

FORMAT_DIRS := $(wildcard include examples tests benchmarks tools)
# The demo: a local cluster of 1 ps + 2 workers (tools/launch) training the seed's MLP
# (examples/mnist_replica) on Fashion-MNIST, then the wide & deep click model
# (examples/ctr: partitioned embeddings, sparse updates) on generated click logs, and the
# same model trained from those logs written as TFRecord files of tf.Example, which each
# step reads through an input pipeline (each worker its file).
# DEMO_ARGS=--sync_replicas for synchronous replicas (both runs).
DEMO_ARGS ?=
DEMO_TRAIN_ARGS := --data_dir /usr/share/datasets/fashion-mnist --train_steps 12000 \
  --learning_rate 0.001 --log_every 1000
DEMO_CTR_ARGS := --train_steps 3000 --log_every 500
DEMO_CTR_DATA := $(BUILD_DIR)/demo-ctr-data

.PHONY: all setup configure build test demo demo-estimate bench plots format clean

all: build

# What `make test` needs (tools/setup.sh --test); `make demo` installs only the demo's.
setup:
	bash tools/setup.sh --test

configure:
	cmake --preset $(PRESET)

build: configure
	cmake --build --preset $(PRESET)

# What building needs first; what only the tests run (a headless Chromium, Slurm, Open MPI,
# ...) installs beside the build, which does not use it: on a fresh machine the download
# and unpacking overlap the compiler's work.
test:
	bash tools/setup.sh --test-build
	@log=$$(mktemp -t loom-setup-test.XXXXXX); \
	  bash tools/setup.sh --test >"$$log" 2>&1 & setup=$$!; \
	  $(MAKE) --no-print-directory build; built=$$?; \
	  if ! wait $$setup; then \
	    cat "$$log" >&2; rm -f "$$log"; \
	    echo "make test: installing the tests' packages failed" >&2; exit 1; \
	  fi; \
	  cat "$$log"; rm -f "$$log"; \
	  [ $$built -eq 0 ] || exit $$built; \
	  ctest --preset $(PRESET)

demo:
	bash tools/setup.sh
	@$(MAKE) --no-print-directory demo-estimate
	$(MAKE) --no-print-directory configure
	cmake --build --preset $(PRESET) --target mnist_replica ctr loom-launch
	./$(BUILD_DIR)/tools/loom-launch --ps 1 --workers 2 -- \
	  ./$(BUILD_DIR)/examples/mnist_replica $(DEMO_TRAIN_ARGS) $(DEMO_ARGS)
	./$(BUILD_DIR)/tools/loom-launch --ps 1 --workers 2 -- \
	  ./$(BUILD_DIR)/examples/ctr $(DEMO_CTR_ARGS) $(DEMO_ARGS)
	./$(BUILD_DIR)/examples/ctr --write_data $(DEMO_CTR_DATA) --write_formats tfrecord \
	  $(DEMO_CTR_ARGS)
	./$(BUILD_DIR)/tools/loom-launch --ps 1 --workers 2 -- \
	  ./$(BUILD_DIR)/examples/ctr $(DEMO_CTR_ARGS) --format tfrecord \
	  --train_files '$(DEMO_CTR_DATA)/train-*.tfrecord' $(DEMO_ARGS)

# Before the demo's first build, how long it will take: about 560 CPU-seconds at -O2 on a
# 2.5 GHz core, 450 of them loom's kernels and the API's compiled-once bodies, which are one
# unit (cmake/loom_kernels.cpp), so more cores shorten it only down to that unit's time.
# (That unit was 570 s there; since parallel_for's scheduler is compiled once it takes 0.79x
# its time, 268 -> 212 CPU-s alone on the EPYC VM of docs/benchmarks.md.)
demo-estimate:
	@if [ ! -x $(BUILD_DIR)/examples/ctr ] || [ ! -x $(BUILD_DIR)/examples/mnist_replica ]; then \
	  cores=$$(nproc 2>/dev/null || echo 1); secs=$$(( 560 / cores )); \
	  [ $$secs -lt 450 ] && secs=450; \
	  echo "demo: the first build (mnist_replica, ctr, loom-launch) takes about" \
	       "$$(( (secs + 30 + 59) / 60 )) minutes on this machine's $$cores core(s);" \
	       "later builds take seconds"; \
	fi

bench: build
	@found=0; \
	for b in $(BUILD_DIR)/benchmarks/*; do \
	  if [ -f "$$b" ] && [ -x "$$b" ]; then \
	    found=1; echo "== $$b"; "$$b" || exit 1; \
	  fi; \
	done; \
	if [ $$found -eq 0 ]; then echo "bench: no benchmark executables in $(BUILD_DIR)/benchmarks/"; fi

# The PNGs of docs/images/ from the benchmarks' output saved in docs/data/ (docs/data/README.md
# says how each was made). Debian's interpreter, where Debian's python3-matplotlib is.
plots:
	bash tools/setup.sh --plots
	/usr/bin/python3 tools/plots.py all

format:
	@find $(FORMAT_DIRS) -type f \( -name '*.hpp' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) \
	  -print0 | xargs -0 -r clang-format -i
	@echo "format: done"

clean:
	rm -rf build build-clang build-debug
