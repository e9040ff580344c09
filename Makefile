# Thin wrapper over CMake. `make run` serves the bundled model (the main job);
# `make test` sets up and passes the tests; `make generate` is a one-shot run.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
PROMPT ?= Once upon a time
CMAKE_FLAGS ?=

ADDR ?= 127.0.0.1
PORT ?= 7077
HTTP_PORT ?= 8080

# Hardening (fuzz/README.md): `make fuzz FUZZ_SECONDS=N` runs each libFuzzer
# target for N seconds (needs clang); `make sanitize` runs the whole suite
# under ASan+UBSan; `make tsan` the server, protocol and session tests under
# ThreadSanitizer. Each uses a build directory of its own.
FUZZ_SECONDS ?= 60
FUZZ_BUILD_DIR ?= build-fuzz
SAN_BUILD_DIR ?= build-san
TSAN_BUILD_DIR ?= build-tsan

.PHONY: all build setup setup-test run generate test test-quick clean fuzz sanitize tsan

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
	@echo "cairn: serving models/stories260K.gguf (Ctrl-C stops it); how to connect is printed last"
	@./$(BUILD_DIR)/cairn serve -m models/stories260K.gguf --host $(ADDR) --port $(PORT) \
	    --http-port $(HTTP_PORT)

generate: build
	./$(BUILD_DIR)/cairn run -m models/stories260K.gguf -p "$(PROMPT)" -n 128

# Every test; at the end, the tests that did not run here and why
# (tests/support/skip_report.py).
test: setup-test build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS); rc=$$?; \
	  python3 $(CURDIR)/tests/support/skip_report.py . ; exit $$rc

# The edit-build-test loop: the unit tests, no servers, real models or
# speculative sampling runs (a couple of minutes); CI runs everything.
QUICK_EXCLUDE ?= realmodel|server|http|hardening|route|ckpt|eagle|medusa|gpu|cli|chat|protocol
test-quick: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) -LE '$(QUICK_EXCLUDE)'; rc=$$?; \
	  python3 $(CURDIR)/tests/support/skip_report.py . ; exit $$rc

fuzz: setup-test
	FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_BUILD_DIR=$(FUZZ_BUILD_DIR) JOBS=$(JOBS) fuzz/run_fuzz.sh

sanitize: setup-test
	SAN_BUILD_DIR=$(SAN_BUILD_DIR) JOBS=$(JOBS) fuzz/run_sanitizers.sh asan

tsan: setup-test
	TSAN_BUILD_DIR=$(TSAN_BUILD_DIR) JOBS=$(JOBS) fuzz/run_sanitizers.sh tsan

clean:
	rm -rf $(BUILD_DIR)
