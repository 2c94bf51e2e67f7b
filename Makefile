# `make run` and `make test` install what they need first (idempotent), then run.
VENV       ?= .venv
PYTHON     ?= python3
PY         := $(VENV)/bin/python
EXPERIMENT ?= default
METHOD     ?= fedavg
SEED       ?= 0
SET        ?=
RESUME     ?=
FRESH      ?=
OUTPUT_DIR ?= results
GPUS       ?= 0
# RAY_ADDRESS=HOST:PORT runs the clients on that existing Ray cluster (README "On a Ray
# cluster"); unset (or "local"): a local Ray. Ray's own variable, so an exported one counts.
RAY_ADDRESS ?=
RUNS       ?= $(OUTPUT_DIR)/$(EXPERIMENT)
COMPARE_ARGS ?=
FMNIST_DIR := /usr/share/datasets/fashion-mnist
# A shell test: the Debian package's Fashion-MNIST is there (gzipped or not)
HAVE_FMNIST = { test -f $(FMNIST_DIR)/train-images-idx3-ubyte.gz || test -f $(FMNIST_DIR)/train-images-idx3-ubyte; }

.PHONY: install check-resume run compare test lint dataset compose-tool compose-demo clean-flwr

install: $(VENV)/.installed dataset

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	@# Plain `flwr run .` inside the activated venv must never install dependencies at run time.
	@grep -q FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION $(VENV)/bin/activate || \
	  printf '\n# contrastive-fl: no runtime dependency installation, no telemetry\nexport FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1\n' >> $(VENV)/bin/activate
	@touch $@

# Fashion-MNIST in the Debian package's folder (installed when run as root); otherwise a
# note only: a run with another data.root or dataset needs no install, and the launcher
# checks a run's data files before Flower starts (exit 2, naming what to do).
dataset:
	@if ! $(HAVE_FMNIST); then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Fashion-MNIST (Debian package dataset-fashion-mnist)"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist) || \
	      echo "note: could not install dataset-fashion-mnist; a run that needs it stops with a data error"; \
	  else \
	    echo "note: Fashion-MNIST is not in $(FMNIST_DIR) (sudo apt-get install dataset-fashion-mnist);" \
	         "a run that needs it stops with a data error unless SET=\"data.root=/folder/with/the/IDX/files\"" \
	         "(or SET=\"data.root=/folder data.download=true\" to download it there)"; \
	  fi; \
	fi

# RESUME=1/true/yes continues from the last checkpoint; anything but those and 0/false/no
# is an error (checked for `make run` only, so a stray RESUME breaks no other target).
# FRESH=1 starts over where an unfinished run with a checkpoint, or a completed run of
# other settings, would otherwise be kept (the same values).
# $(call on,VALUE): non-empty for a RESUME/FRESH value that means "yes"
on = $(filter 1 true yes,$(1))
check-resume:
	@case "$(RESUME)" in ""|0|1|true|false|yes|no) ;; \
	  *) echo "RESUME=$(RESUME): use RESUME=1 to continue from the last checkpoint, or leave it out" >&2; exit 2 ;; esac
	@case "$(FRESH)" in ""|0|1|true|false|yes|no) ;; \
	  *) echo "FRESH=$(FRESH): use FRESH=1 to start over and replace an unfinished run, or leave it out" >&2; exit 2 ;; esac
	@if [ -n "$(call on,$(RESUME))" ] && [ -n "$(call on,$(FRESH))" ]; then \
	  echo "RESUME=$(RESUME) and FRESH=$(FRESH): choose one (continue the run, or start it over)" >&2; exit 2; fi

run: check-resume install
	$(PY) -m fl_app.launch --experiment "$(EXPERIMENT)" --method "$(METHOD)" --seed "$(SEED)" \
	  --output-dir "$(OUTPUT_DIR)" --set "$(SET)" --gpus-per-client "$(GPUS)" --ray-address "$(RAY_ADDRESS)" \
	  $(if $(call on,$(RESUME)),--resume) $(if $(call on,$(FRESH)),--fresh)

# Methods side by side: one table of the runs under RUNS (<output_dir>/<experiment>), e.g.
# make compare EXPERIMENT=p1, or COMPARE_ARGS="--metric ema --plot curves.png"
compare: $(VENV)/.installed
	$(PY) -m fl_app.compare "$(RUNS)" $(COMPARE_ARGS)

# The tests validate docker/docker-compose.yml with `docker-compose config` (Debian's
# docker-compose, no container engine needed); without it they check the YAML structure only.
compose-tool:
	@command -v docker-compose >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing docker-compose (Debian) to validate docker/docker-compose.yml"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null 2>&1) || \
	      echo "could not install docker-compose: the compose test checks the YAML structure only"; \
	  else \
	    echo "docker-compose missing (sudo apt-get install docker-compose): the compose test checks the YAML structure only"; \
	  fi; }

# The docker-compose demo, run for real (docker/demo.sh; root, or a running docker engine):
# the image (base image and wheels made once per machine), SuperLink, three SuperNodes and
# their SuperExecs with TLS and node authentication, a smoke run with `flwr run`, its
# summary, then everything taken down. DEMO_ARGS: deploy/run.sh's options, e.g.
# make compose-demo DEMO_ARGS='--method moon --set "num_rounds=2"'
DEMO_ARGS ?=
compose-demo: $(VENV)/.installed
	docker/demo.sh demo $(if $(DEMO_ARGS),-- $(DEMO_ARGS))

# The end-to-end tests run on the real Fashion-MNIST: without it, stop here and say so.
test: install compose-tool
	@$(HAVE_FMNIST) || { \
	  echo "make test needs Fashion-MNIST in $(FMNIST_DIR): sudo apt-get install dataset-fashion-mnist" >&2; exit 1; }
	$(PY) -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/mypy

# Stop the project's local simulation SuperLink (e.g. after changing environment variables).
clean-flwr:
	-$(PY) -c "from fl_app.launch import stop_all_local_superlinks; stop_all_local_superlinks()"
