# node-agent: set-up, tests and the embedded demo run.
#   make install   system packages (when missing), .venv, requirements, the package
#   make test      install when needed (and nova's .venv-nova), then lint, then the whole test suite
#                  (TEST_LINT= skips lint)
#   make lint      ruff, mypy on the whole package, the import contract
#   make unit      tests/unit: the pure core and the parsers, no server (times: CONTRIBUTING.md)
#   make run       install when needed, then the README's run (see README)
#   make config    regenerate etc/node-agent.conf.sample (never edit it by hand)
#   make docs-design  render docs/design/nova-differences.md from its YAML (never edit the .md)
#   make docs      regenerate docs/reference/ (configuration, CLI, exit codes) from the code
#   make test-nova-cloud  nova 34's own services beside the agent, alone (tests/integration/test_nova_cloud.py)
#   make nova-guests  regenerate tests/data/nova_guests and nova_hostdevs (XML nova 34's libvirt driver writes)
#   make virhostcpu-caps  (as root) recapture tests/data/virhostcpu-caps (a real libvirtd on each sysfs tree)
#   make bench     benchmarks against nova's report client -> BENCHMARKS.md (not in test)
#   make bench-candidates  only BENCHMARKS.md's allocation-candidates section (not in test)
#   make soak      long reliability runs (not in test); see RELIABILITY.md
#   make property  the capacity property test, long (not in test): >= 1,000 steps
#   make test-as-user  (as root) `make test` in a fresh clone as the user node-agent-ci

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Debian packages: libvirt-python builds against libvirt-dev via pkg-config;
# rabbitmq-server is started by the messaging tests themselves; libvirtd, its
# qemu driver and the QEMU emulator of this architecture run the real guests
# of tests/integration/test_real_libvirtd.py (virsh from libvirt-clients is
# for debugging them); qemu-img (qemu-utils) for nova-compute's image backend
# in tests/integration/test_nova_cloud.py.
QEMU_x86_64  := qemu-system-x86
QEMU_i686    := qemu-system-x86
QEMU_aarch64 := qemu-system-arm
QEMU_armv7l  := qemu-system-arm
QEMU_ppc64le := qemu-system-ppc
QEMU_ppc64   := qemu-system-ppc
QEMU_PACKAGE := $(or $(QEMU_$(shell uname -m)),qemu-system-misc)
DEB_PACKAGES := libvirt-dev pkg-config gcc python3-dev rabbitmq-server redis-server postgresql \
	libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients $(QEMU_PACKAGE) qemu-utils
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: install system-packages nova-venv lint unit test test-nova-cloud test-as-user run stop config docs docs-design nova-guests virhostcpu-caps install-service bench bench-candidates soak property clean

# compileall: where PYTHONDONTWRITEBYTECODE is set (as on these machines),
# no import writes bytecode, and every node-agent process would compile the
# package from source again: a dry run then costs twice its CPU (BENCHMARKS.md,
# start-up). pip writes bytecode when it installs a copy (install-service);
# an editable install does not. Up to date, this takes a fraction of a second.
install: $(STAMP)
	$(PY) -m compileall -q node_agent

# NO_UPGRADES=yes (make install-service): stop, listing them, when installing
# the missing packages would upgrade installed ones (a -dev package pins its
# library's version: libsystemd-dev upgrades systemd, libvirt-dev libvirt0 and
# so libvirtd); ALLOW_UPGRADES=yes lets it go on.
NO_UPGRADES ?= no
ALLOW_UPGRADES ?= no
system-packages:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "Installing Debian packages:$$missing"; \
	  if [ "$(SUDO)" = sudo ] && ! command -v sudo >/dev/null; then \
	    echo "not root and no sudo: have root install them first (make system-packages)" >&2; \
	    exit 1; fi; \
	  $(SUDO) apt-get update -q || exit 1; \
	  if [ "$(NO_UPGRADES)" = yes ] && [ "$(ALLOW_UPGRADES)" != yes ]; then \
	    upgrades=$$(apt-get -s -q install --no-install-recommends $$missing 2>/dev/null \
	      | sed -n 's/^Inst \([^ ]*\) \[\([^]]*\)\] (\([^ ]*\).*/\1 \2 -> \3/p'); \
	    if [ -n "$$upgrades" ]; then \
	      echo "Installing$$missing would also upgrade these installed packages:" >&2; \
	      echo "$$upgrades" | sed 's/^/  /' >&2; \
	      echo "Nothing was installed. Upgrade them yourself first, or run again with ALLOW_UPGRADES=yes." >&2; \
	      exit 1; fi; fi; \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q \
	    --no-install-recommends $$missing; \
	fi

$(STAMP): requirements.txt test-requirements.txt pyproject.toml
	$(MAKE) system-packages
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt -r test-requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

# The import contract, tests/unit/test_import_contract.py: the packages import
# downward only (its FLOORS table), no import closes a cycle, and the pure core
# (its PURE_PACKAGES and PURE_MODULES) imports nothing that touches the world.
lint: install
	$(VENV)/bin/ruff check node_agent tests bench soak devenv
	$(VENV)/bin/ruff format --check node_agent tests bench soak devenv
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -p no:cacheprovider tests/unit/test_import_contract.py

# Every test under tests/unit: a new file there is in `make unit` by being there.
unit: install
	$(PY) -m pytest -q -p no:cacheprovider tests/unit

# The nova conformance tests (tests/conformance) run nova 34 in its own
# .venv-nova, built once like .venv. When it cannot be built (no package
# index) the tests skip with a loud reason instead of failing the suite;
# with NODE_AGENT_REQUIRE_REAL=1 (CI) both make and the tests fail instead.
# TEST_LINT= leaves lint out: tests/run-as-user.sh does, since the root pass
# of .ci/run has linted the same commit (lint does not depend on the user).
# compileall: the suite starts hundreds of node-agent processes; where
# PYTHONDONTWRITEBYTECODE is set no import writes bytecode, and each of them
# would compile the whole package again (tests/cli: 46 s CPU -> 39 s).
TEST_LINT ?= lint
test: install nova-venv $(TEST_LINT)
	$(PY) -m compileall -q node_agent devenv tests
	$(PY) -m pytest -q -rs --durations=15

# As root: `make test` in a fresh clone of this commit, as an unprivileged
# user (created when missing); see tests/run-as-user.sh.
test-as-user:
	tests/run-as-user.sh

# nova-conductor and nova-compute (nova's libvirt driver, the suite's private
# libvirtd, RabbitMQ and Placement) with the agent in companion mode beside
# them; part of `make test` too. As root (libvirtd's namespace).
test-nova-cloud: install nova-venv
	$(PY) -m pytest -q -rs --durations=10 tests/integration/test_nova_cloud.py

nova-venv:
	@$(MAKE) --no-print-directory $(NOVA_VENV)/.installed || { \
	  if [ "$$NODE_AGENT_REQUIRE_REAL" = 1 ]; then \
	    echo "ERROR: $(NOVA_VENV) could not be built and NODE_AGENT_REQUIRE_REAL=1: the nova conformance tests must run"; \
	    exit 1; fi; \
	  echo "WARNING: $(NOVA_VENV) could not be built: the nova conformance tests will be SKIPPED"; }

run: install
	$(PY) -m devenv.demo

stop:
	@if [ -f run/placement/server.pid ]; then \
	  kill $$(cat run/placement/server.pid) 2>/dev/null && echo "embedded Placement stopped"; \
	  rm -f run/placement/server.pid run/placement/url; \
	else echo "no embedded Placement is running"; fi

config: install
	$(VENV)/bin/oslo-config-generator --namespace node_agent \
	  --output-file etc/node-agent.conf.sample --wrap-width 79

# The design docs rendered from data (STYLE.md habit 16): the table of
# differences from nova, docs/design/nova-differences.yaml, which the
# conformance tests read, becomes docs/design/nova-differences.md.
# tests/conformance/test_differences_table.py fails when the page is stale.
docs-design: install
	$(PY) -m devenv.docs_design
# docs/reference/*.md from the option definitions, the argparse tree and the
# error hierarchy (devenv/reference.py); tests/unit/test_reference_docs.py
# fails when a committed file is stale.
docs: install
	$(PY) -m devenv.reference

# Install the service (see systemd/README): a runtime-only virtualenv in
# $(SERVICE_PREFIX) made with Debian's Python (the unit's ProtectHome=yes would
# hide an interpreter or a checkout under /root or /home), the package and its
# runtime dependencies from pyproject.toml held to requirements.txt's
# versions, no test packages; from a copy of the sources, so nothing is built
# in (or owned by root in) this checkout, and nothing links back to it.
# (bin/pip, not python -m pip: that would put the checkout on sys.path.)
# JOURNAL=yes adds the `journal` extra (systemd-python, built against
# libsystemd-dev), for `use_journal = true` only: stderr reaches the journal
# under the unit without it, and sd_notify needs no binding (the sdnotify
# package). Debian's python3-systemd cannot reach this venv (a
# --system-site-packages venv would also let Debian's other packages shadow
# the pinned ones, and fails `pip check` on them).
SERVICE_PREFIX ?= /opt/node-agent
SERVICE_PYTHON ?= /usr/bin/python3
JOURNAL ?= no
SERVICE_DEB_PACKAGES := libvirt-dev pkg-config gcc python3-dev python3-venv \
	$(if $(filter yes,$(JOURNAL)),libsystemd-dev)
SERVICE_EXTRAS := $(if $(filter yes,$(JOURNAL)),[journal])

install-service:
	@echo "make install-service: the build packages $(strip $(SERVICE_DEB_PACKAGES)) when missing (never"
	@echo "  upgrading installed ones: see ALLOW_UPGRADES), the user node-agent, /etc/node-agent,"
	@echo "  the virtualenv $(SERVICE_PREFIX), links in /usr/local/bin, the unit in /etc/systemd/system."
	$(MAKE) system-packages DEB_PACKAGES="$(SERVICE_DEB_PACKAGES)" NO_UPGRADES=yes
	id node-agent >/dev/null 2>&1 || $(SUDO) useradd --system --home-dir /var/lib/node-agent --shell /usr/sbin/nologin node-agent
	@getent group libvirt >/dev/null || { \
	  echo "WARNING: there is no group libvirt here (Debian's libvirt-daemon-system makes it, with libvirtd's"; \
	  echo "  read-only socket): systemd will refuse to start the unit (status=216/GROUP, SupplementaryGroups=libvirt)."; \
	  echo "  Install libvirt-daemon-system, or give the unit the group of your libvirt socket"; \
	  echo "  (systemctl edit node-agent: [Service] SupplementaryGroups= then SupplementaryGroups=GROUP)."; }
	$(SUDO) install -d -m 0750 -o root -g node-agent /etc/node-agent
	[ -e /etc/node-agent/node-agent.conf ] || $(SUDO) install -m 0640 -o root -g node-agent etc/node-agent.conf.sample /etc/node-agent/node-agent.conf
	[ -x $(SERVICE_PREFIX)/bin/python ] || $(SUDO) $(SERVICE_PYTHON) -m venv $(SERVICE_PREFIX)
	$(SUDO) $(SERVICE_PREFIX)/bin/pip install -q --upgrade pip
	src=$$(mktemp -d) && trap 'rm -rf "$$src"' EXIT && \
	  cp -r pyproject.toml node_agent "$$src/" && \
	  version=$$(PYTHONPATH=. $(SERVICE_PYTHON) -m node_agent.version) && \
	  echo "VERSION = \"$$version\"" > "$$src/node_agent/_build_version.py" && \
	  echo "node-agent version: $$version" && chmod -R a+rX "$$src" && \
	  $(SUDO) $(SERVICE_PREFIX)/bin/pip install -q -c requirements.txt "$$src$(SERVICE_EXTRAS)"
	$(SUDO) $(SERVICE_PREFIX)/bin/pip check
	$(SUDO) ln -sfn $(SERVICE_PREFIX)/bin/node-agent /usr/local/bin/node-agent
	$(SUDO) ln -sfn $(SERVICE_PREFIX)/bin/node-agent-applier /usr/local/bin/node-agent-applier
	$(SUDO) install -m 0644 systemd/node-agent.service /etc/systemd/system/node-agent.service
	if [ -d /run/systemd/system ]; then $(SUDO) systemctl daemon-reload; else \
	  echo "systemd is not running here (a container or an image being built): the unit is installed; systemd loads it at boot"; fi
	@echo "Edit /etc/node-agent/node-agent.conf, check it with: node-agent --config-file /etc/node-agent/node-agent.conf --check-config"
	@echo "then: systemctl enable --now node-agent"

NOVA_VENV := .venv-nova

# nova 34 in its own venv, for `make bench` and the conformance tests.
$(NOVA_VENV)/.installed: bench/requirements-nova.txt
	[ -x $(NOVA_VENV)/bin/python ] || $(PYTHON) -m venv $(NOVA_VENV)
	$(NOVA_VENV)/bin/python -m pip install -q --upgrade pip
	$(NOVA_VENV)/bin/python -m pip install -q -r bench/requirements-nova.txt
	touch $@

# The guest XML corpus: nova's own libvirt driver, in .venv-nova, writes each
# guest and says how it counts it (tests/data/nova_guests/README.md).
# tests/conformance/test_nova_guests.py fails when the committed files differ.
nova-guests: $(NOVA_VENV)/.installed
	PYTHONPATH= $(NOVA_VENV)/bin/python tests/data/nova_guests/generate.py
	PYTHONPATH= $(NOVA_VENV)/bin/python tests/data/nova_hostdevs/generate.py

# What a real libvirtd answers reading each virhostcpudata tree as its
# /sys/devices/system (tests/data/virhostcpu-caps/README.md); root, libvirtd
# and QEMU needed, the suite only reads the files.
virhostcpu-caps: install
	$(PY) tests/data/virhostcpu-caps/generate.py

# PostgreSQL's programs (sections 4, 6 and 7) and GNU time (peak RSS of a
# process, section 3).
BENCH_DEB_PACKAGES := postgresql time

bench: install $(NOVA_VENV)/.installed
	$(MAKE) system-packages DEB_PACKAGES="$(BENCH_DEB_PACKAGES)"
	$(PY) -m pip install -q -r bench/requirements.txt
	$(PY) -m bench.run

# BENCHMARKS.md's allocation-candidates section alone (embedded Placement
# only: no nova venv, no PostgreSQL).
bench-candidates: install
	$(PY) -m bench.run --only candidates

SOAK_SEED ?= 20240

soak: install
	NODE_AGENT_FUZZ_EXAMPLES=3000 $(PY) -m pytest -q tests/reliability/test_fuzz_parsers.py
	NODE_AGENT_KILL_POINTS=1,2,3,4,5,6,7,8,9,10 $(PY) -m pytest -q \
	  tests/reliability/test_placement_faults.py -k killed
	$(PY) -m soak.run --cycles 2000 --seed $(SOAK_SEED) --report RELIABILITY-soak.json

# Issue 12's property test, longer than in `make test` (8 x 30 steps there).
PROPERTY_SEED     ?= 20261123
PROPERTY_EXAMPLES ?= 40
PROPERTY_STEPS    ?= 40

property: install
	NODE_AGENT_PROPERTY_SEED=$(PROPERTY_SEED) \
	NODE_AGENT_PROPERTY_EXAMPLES=$(PROPERTY_EXAMPLES) \
	NODE_AGENT_PROPERTY_STEPS=$(PROPERTY_STEPS) \
	  $(PY) -m pytest -q -s tests/integration/test_capacity_property.py

clean:
	rm -rf $(VENV) $(NOVA_VENV) build *.egg-info
