# node-agent: set-up, tests and the embedded demo run.
#   make install   system packages (when missing), .venv, requirements, the package
#   make test      install when needed, then the whole test suite
#   make run       install when needed, then the README's run (see README)
#   make config    regenerate etc/node-agent.conf.sample (never edit it by hand)
#   make bench     benchmarks against nova's report client -> BENCHMARKS.md (not in test)
#   make soak      long reliability runs (not in test); see RELIABILITY.md

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Debian packages: libvirt-python builds against libvirt-dev via pkg-config;
# rabbitmq-server is started by the messaging tests themselves.
DEB_PACKAGES := libvirt-dev pkg-config gcc python3-dev rabbitmq-server
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: install system-packages test run stop config install-service bench soak clean

install: $(STAMP)

system-packages:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "Installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q $$missing; \
	fi

$(STAMP): requirements.txt test-requirements.txt pyproject.toml
	$(MAKE) system-packages
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt -r test-requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

test: install
	$(PY) -m pytest -q

run: install
	$(PY) -m node_agent.demo

stop:
	@if [ -f run/placement/server.pid ]; then \
	  kill $$(cat run/placement/server.pid) 2>/dev/null && echo "embedded Placement stopped"; \
	  rm -f run/placement/server.pid run/placement/url; \
	else echo "no embedded Placement is running"; fi

config: install
	$(VENV)/bin/oslo-config-generator --namespace node_agent \
	  --output-file etc/node-agent.conf.sample --wrap-width 79

# Install the systemd unit and a dedicated user (see systemd/README).
install-service: install
	id node-agent >/dev/null 2>&1 || $(SUDO) useradd --system --home-dir /var/lib/node-agent --shell /usr/sbin/nologin node-agent
	$(SUDO) install -d -m 0750 -o root -g node-agent /etc/node-agent
	[ -e /etc/node-agent/node-agent.conf ] || $(SUDO) install -m 0640 -o root -g node-agent etc/node-agent.conf.sample /etc/node-agent/node-agent.conf
	$(SUDO) ln -sf "$(CURDIR)/$(VENV)/bin/node-agent" /usr/local/bin/node-agent
	$(SUDO) install -m 0644 systemd/node-agent.service /etc/systemd/system/node-agent.service
	$(SUDO) systemctl daemon-reload
	@echo "Edit /etc/node-agent/node-agent.conf, check it with: node-agent --config-file /etc/node-agent/node-agent.conf --check-config"
	@echo "then: systemctl enable --now node-agent"

NOVA_VENV := .venv-nova

$(NOVA_VENV)/.installed: bench/requirements-nova.txt
	[ -x $(NOVA_VENV)/bin/python ] || $(PYTHON) -m venv $(NOVA_VENV)
	$(NOVA_VENV)/bin/python -m pip install -q --upgrade pip
	$(NOVA_VENV)/bin/python -m pip install -q -r bench/requirements-nova.txt
	touch $@

bench: install $(NOVA_VENV)/.installed
	$(PY) -m pip install -q -r bench/requirements.txt
	$(PY) -m bench.run

SOAK_SEED ?= 20240

soak: install
	NODE_AGENT_FUZZ_EXAMPLES=3000 $(PY) -m pytest -q tests/reliability/test_fuzz_parsers.py
	NODE_AGENT_KILL_POINTS=1,2,3,4,5,6,7,8,9,10 $(PY) -m pytest -q \
	  tests/reliability/test_placement_faults.py -k killed
	$(PY) -m soak.run --cycles 2000 --seed $(SOAK_SEED) --report RELIABILITY-soak.json

clean:
	rm -rf $(VENV) $(NOVA_VENV) build *.egg-info
