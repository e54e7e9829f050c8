# Two commands set up and run everything on a fresh machine: `make fig7` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

FIGURES := fig2 fig6 fig7 fig8 fig9 fig10 fig11 fig12
# `make fig7 WORLD_SIZE=4 ARGS="--iters=20"`: any driver Config field can be overridden through ARGS.
# WORLD_SIZE applies to the commands measured at one world size; those that sweep world sizes refuse it (fig9 takes
# ARGS="--world_sizes=1,2,4"), as gpu-check does (it runs on every visible GPU).
WS_ARG = $(if $(WORLD_SIZE),--world_size=$(WORLD_SIZE))
fig2 fig9 fig10 zero simval hostval: WS_ARG = $(if $(WORLD_SIZE),$(error WORLD_SIZE=$(WORLD_SIZE): make $@ sweeps \
	world sizes; give them as ARGS="--world_sizes=..."))
gpu-check: WS_ARG = $(if $(WORLD_SIZE),$(error WORLD_SIZE=$(WORLD_SIZE): make gpu-check runs on every visible GPU))

.PHONY: setup test lint stress clean figures plots report claims timeline bench bucket-cost gpu-check simval hostval tune autotune zero torch-ddp-tests $(FIGURES)

setup: $(STAMP)

# Reinstall only when the project's dependencies change; a second `make setup` does nothing. The figures need the
# runtime dependencies only; `make test` adds the test tools. uv installs the wheels in parallel (~40 s for torch's
# ~5 GB of CUDA wheels, where pip takes ~100 s); pip does it wherever uv cannot be installed or fails. Neither
# byte-compiles the whole environment (pip did, for 125 s): the modules every run imports are compiled once after
# the install (~20 s). Bytecode is written even where the shell sets PYTHONDONTWRITEBYTECODE: without it every rank
# would compile the modules it imports again, seconds per process.
INSTALL = $(PY) -m pip install --quiet uv && $(VENV)/bin/uv pip install --quiet --python $(PY) $(1) \
	|| $(PY) -m pip install --quiet --no-compile $(1)
unexport PYTHONDONTWRITEBYTECODE
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(call INSTALL,-e .)
	$(PY) -c "import torch.distributed, torchvision, transformers.models.bert, pandas, matplotlib.pyplot, harness.workloads.runner"
	touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(call INSTALL,-e '.[test]')
	touch $(TEST_STAMP)

# The formatter and the linter (ruff, configured in pyproject.toml), clean on every file; tests/test_lint.py runs
# the same inside `make test`.
lint: $(TEST_STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# `make test ARGS="-k bucket --durations=10"`: ARGS go to pytest.
test: $(TEST_STAMP)
	$(PY) -m pytest tests $(ARGS)

# The flake hunt: every test file that launches processes 10 times (every other run beside a CPU hog), a user's exit
# script 30 times per DDP and ending, and on request CI's `make test` in fresh clones -> results/stress/*.csv and
# tables of failures (hours on 2 cores); `make stress ARGS="--runs=0 --exit_runs=0 --fresh_clones=13 --hog_clones=3"`.
stress: $(TEST_STAMP)
	$(PY) -m tests.stress $(ARGS)

$(FIGURES): setup
	$(PY) -m experiments $@ $(WS_ARG) $(ARGS)

# every figure's ARGS checked (a dry run each, seconds) before hours of measuring: not every driver has every field
figures: setup
	@for f in $(FIGURES); do $(PY) -m experiments $$f $(ARGS) --dry-run > /dev/null || exit 2; done
	$(MAKE) --no-print-directory $(FIGURES)

# DDP beside ZeRO-1, FSDP2 (ZeRO-3 and ZeRO-2-like) and DeepSpeed ZeRO 1-3: runtime, memory by category, traffic
# (results/figures/zero.png); `make zero ARGS="--models=resnet101 --world_sizes=1,2 --optimizer=sgd"`.
zero: setup
	$(PY) -m experiments zero $(WS_ARG) $(ARGS)

plots: setup
	$(PY) -m experiments plots $(ARGS)

# The numbers of README.md, REPRODUCTION.md and BENCHMARKS.md, regenerated from results/reference into their
# marked regions (`make test` fails when a committed document differs from what they give).
report: setup
	$(PY) -m experiments report --write $(ARGS)

# One iteration's per-bucket timeline (ready, launch, true completion) as a figure and a Chrome/Perfetto trace.
timeline: setup
	$(PY) -m experiments timeline $(WS_ARG) $(ARGS)

# Every measured number beside the paper's, one chart (results/figures/claims.png), from stored results.
claims: setup
	$(PY) -m experiments claims $(ARGS)

# Our DDP vs torch's, interleaved, per (model, bucket cap); `make bench ARGS="--models=resnet50 --bucket_caps_mb=25"`.
bench: setup
	$(PY) -m experiments bench $(WS_ARG) $(ARGS)

# Where DDP's cost per bucket goes: ours and torch's at a bucket per gradient beside one bucket, and ours's path step
# by step beside the floor any Python caller pays (results/bucket_cost/); `make bucket-cost ARGS="--world_size=2"`.
bucket-cost: setup
	$(PY) -m experiments bucket-cost $(ARGS)

# The GPU path in one command on any CUDA machine (~6 min on one H100): ours vs torch's DDP on the device, the bench
# at world size = GPUs, a fig7 smoke on NCCL, predict beside it -> results/gpu-check/summary.md; without CUDA it
# says so and exits 0. With torch preinstalled and no network: `PYTHONPATH=. python3 -m experiments gpu-check`.
gpu-check: setup
	$(PY) -m experiments gpu-check $(WS_ARG) $(ARGS)

# The simulator's predictions against fresh measurements (results/simval/, results/figures/simval.png; 3 rounds + a
# side-by-side tuning check, under 45 min; the full grid, ~3 h: ARGS="--nets=1gbit,2gbit,4gbit --world_sizes=3,4").
simval: setup
	$(PY) -m experiments simval $(WS_ARG) $(ARGS)

# What the simulator says DDP adds, where the host sets the pace: tiny-layers' DDP at 80/9/1 buckets, at 1 and 2 ranks,
# against predictions from its compute measured beside it (results/hostval/hostval.csv; 8 repeats each, ~7 min).
hostval: setup
	$(PY) -m experiments hostval $(WS_ARG) $(ARGS)

# A bucket cap recommended by the simulator, then measured beside torch's default and the best measured cap
# (results/figures/tune.png); `make tune ARGS="--model=bert-base --world_size=3 --net=1gbit"`.
tune: setup
	$(PY) -m experiments tune $(WS_ARG) $(ARGS)

# bucket_cap_mb="auto": ours finding its cap while training, beside every fixed cap (~25 min on 2 cores)
autotune: setup
	$(PY) -m experiments autotune $(WS_ARG) $(ARGS)

# torch's own DDP tests against ours (~10 min, outside `make test`); fails if ours misses one torch passes
TORCH_SUITE_OUT ?= /tmp/torch-ddp-tests
torch-ddp-tests: $(TEST_STAMP)
	SHIM_CUDA=1 OUT=$(TORCH_SUITE_OUT) tests/torch_suite/run.sh ours; \
	$(PY) tests/torch_suite/check.py $(TORCH_SUITE_OUT)/ours-shim.xml

clean:
	rm -rf $(VENV) .pytest_cache
