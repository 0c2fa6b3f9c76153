# Thin wrapper over CMake. `make demo` and `make test` install what they need first.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
PREFIX ?= /usr/local

.PHONY: all deps deps-demo build install demo demo-gpt test bench sanitize clean

all: build

deps:
	@scripts/install-deps

# Only the packages the library, the tessera command and the demo's data need (no Python or PyTorch).
deps-demo:
	@scripts/install-deps --demo

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

# A build the demo configured without its CUDA kernels (below) gets them back first.
build: $(BUILD)/CMakeCache.txt
	@if [ -f $(BUILD)/demo-without-cuda ]; then \
	  echo "make: configuring $(BUILD) with the CUDA backend again (make demo left it out)"; \
	  cmake -S . -B $(BUILD) -DTS_CUDA=AUTO && rm -f $(BUILD)/demo-without-cuda; fi
	cmake --build $(BUILD) -j $(JOBS)

# Headers, libtessera.a/.so, bin/tessera, lib/pkgconfig/tessera.pc, lib/cmake/Tessera/ under
# $(PREFIX) (DESTDIR=/staging is honoured, for packagers).
install: build
	cmake --install $(BUILD) --prefix "$(PREFIX)"

# Train the reference CNN on Fashion-MNIST with two DDP processes (32 images per rank:
# the global batch of 64 and the learning rate of a one-process run). Builds the tessera command
# alone (the library with it; no tests, examples or fuzz targets) in the same build/ as `make test`,
# so a later `make test` builds only the rest. The demo trains on the CPU: on a machine with the CUDA
# toolkit but no NVIDIA driver (no libcuda.so.1), a build/ it configures leaves the CUDA kernels out
# (half the demo's compile time) and says so in build/demo-without-cuda, and `make`/`make test`
# configure them back in (recompiling the library once).
# DEMO_FLAGS adds flags, e.g. make demo DEMO_FLAGS="--precision bf16"
DEMO_FLAGS ?=
DEMO_NO_CUDA = $(shell { command -v nvcc || [ -x /usr/local/cuda/bin/nvcc ]; } >/dev/null 2>&1 && \
                 ! /sbin/ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 ' && echo 1)
demo: deps-demo
	@if [ ! -f $(BUILD)/CMakeCache.txt ] && [ -n "$(DEMO_NO_CUDA)" ]; then \
	  echo "make demo: the CUDA toolkit but no NVIDIA driver here: building without the CUDA kernels" \
	       "(the demo trains on the CPU; make or make test adds them)"; \
	  cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DTS_CUDA=OFF $(CMAKE_FLAGS) && touch $(BUILD)/demo-without-cuda; \
	else $(MAKE) --no-print-directory $(BUILD)/CMakeCache.txt; fi
	cmake --build $(BUILD) -j $(JOBS) --target tessera
	$(BUILD)/tessera train --model cnn --epochs 4 --nproc 2 --batch-size 32 --checkpoint $(BUILD)/demo.ckpt --metrics-json $(BUILD)/demo-metrics.json $(DEMO_FLAGS)

# A small GPT trained for a few minutes on the King James Bible as bytes, then text sampled from it
# (scripts/demo_gpt.sh; DEMO_FLAGS adds flags to its tessera train).
demo-gpt: deps-demo
	$(MAKE) --no-print-directory $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS) --target tessera
	scripts/demo_gpt.sh $(BUILD) $(DEMO_FLAGS)

test: deps build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# Address/UB sanitizer build and test run in build-asan/.
sanitize: deps
	$(MAKE) test BUILD=build-asan CMAKE_FLAGS="-DTS_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug"

# Tessera beside PyTorch (Debian python3-torch, installed here) in one run.
bench: build
	TS_WITH_TORCH=1 scripts/install-deps
	bench/train_vs_pytorch.sh $(BUILD)

clean:
	rm -rf $(BUILD) build-asan
