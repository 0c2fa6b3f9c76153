# Thin wrapper over CMake. `make demo` and `make test` install what they need first.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
PREFIX ?= /usr/local

.PHONY: all deps build install demo test bench sanitize clean

all: build

deps:
	@scripts/install-deps

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# Headers, libtessera.a/.so, bin/tessera, lib/pkgconfig/tessera.pc, lib/cmake/Tessera/ under
# $(PREFIX) (DESTDIR=/staging is honoured, for packagers).
install: build
	cmake --install $(BUILD) --prefix "$(PREFIX)"

# Train the reference CNN on Fashion-MNIST with two DDP processes (32 images per rank:
# the global batch of 64 and the learning rate of a one-process run).
# DEMO_FLAGS adds flags, e.g. make demo DEMO_FLAGS="--precision bf16"
DEMO_FLAGS ?=
demo: deps build
	$(BUILD)/tessera train --model cnn --epochs 4 --nproc 2 --batch-size 32 --checkpoint $(BUILD)/demo.ckpt --metrics-json $(BUILD)/demo-metrics.json $(DEMO_FLAGS)

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
