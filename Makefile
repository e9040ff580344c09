# Thin wrapper over CMake. `make run` runs the main job on the bundled model;
# `make test` sets up and passes the tests.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
PROMPT ?= Once upon a time
CMAKE_FLAGS ?=

.PHONY: all build setup setup-test run test clean

all: build

setup:
	@scripts/setup.sh

setup-test:
	@scripts/setup.sh --test

$(BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS)

build: setup $(BUILD_DIR)/CMakeCache.txt
	cmake --build $(BUILD_DIR) -j $(JOBS)

run: build
	./$(BUILD_DIR)/cairn run -m models/stories260K.gguf -p "$(PROMPT)" -n 128

test: setup-test build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

clean:
	rm -rf $(BUILD_DIR)
