# Thin wrapper over CMake. `make run` serves the bundled model (the main job);
# `make test` sets up and passes the tests; `make generate` is a one-shot run.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
PROMPT ?= Once upon a time
CMAKE_FLAGS ?=

ADDR ?= 127.0.0.1
PORT ?= 7077

.PHONY: all build setup setup-test run generate test clean

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
	@echo "cairn: serving models/stories260K.gguf on $(ADDR):$(PORT) (Ctrl-C stops it). Connect with:"
	@echo "  python3 clients/python/examples/agent.py --addr $(ADDR):$(PORT)"
	@echo "  python3 clients/python/examples/rag.py --addr $(ADDR):$(PORT)"
	./$(BUILD_DIR)/cairn serve -m models/stories260K.gguf --host $(ADDR) --port $(PORT)

generate: build
	./$(BUILD_DIR)/cairn run -m models/stories260K.gguf -p "$(PROMPT)" -n 128

test: setup-test build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

clean:
	rm -rf $(BUILD_DIR)
