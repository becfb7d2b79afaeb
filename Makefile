# Two commands set up a fresh machine: `make demo` (the main job) and `make test`.
# Both create .venv, install torch==2.13.0 first (the CPU build; any other torch
# request would pull several GB of CUDA packages), then polydist with its extras
# (ft: torchft, for polydist run --fault-tolerant).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.polydist-installed

.PHONY: demo test test-torch test-ft fuzz setup docs docs-setup docs-serve horovod test-horovod xla test-xla mpi-runtimes test-openmpi test-impi engines test-engines test-heavy hang-table test-slurm test-system clean

setup: $(STAMP)

# No build isolation: the compiled all_reduce of the MPI group (setup.py) is a torch extension, built against the
# torch installed first; pip's isolated build would have no torch (and setup.py would leave it out).
$(STAMP): pyproject.toml setup.py src/polydist/collectives/_record.c src/polydist/backends/mpi4py/_lean.cpp src/polydist/backends/_dispatch.cpp  # reinstalled (rebuilt) when a compiled source changes
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet torch==2.13.0 "setuptools>=68"
	$(BIN)/python -m pip install --quiet --no-build-isolation -e ".[examples,test,ft]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/polydist run --nproc-per-node 2 examples/train_digits.py

# The whole suite, with the MPI smoke tests also under Open MPI and Intel MPI (tests/backends/mpi4py/test_mpi_runtimes.py);
# it prints its 25 slowest tests. What belongs in it, and the heavier targets below: docs/contributing.md.
# The library and its launch paths (about 12 minutes on 2 cores): every test but the system tests and the engines.
SUITE := -m "not engines and not system and not ft" --durations=25
test: $(STAMP)
	$(BIN)/python -m pytest $(SUITE)

# make test's suite on another torch (TORCH=2.14.1; the tested versions: docs/getting-started.md), with the MPI smoke tests
# also under Open MPI and Intel MPI, in a venv of its own, $(VENV)-torch-$(TORCH) (2.14.1's wheel pulls ~4 GB of
# CUDA packages; ~1 minute with the pip cache warm); the main venv keeps 2.13.0. polydist is installed into it, not
# linked (an editable install would rebuild the compiled parts in src/ for that torch, under the main venv's feet),
# so the stamp depends on every source file: a change reinstalls it (seconds; the compiled parts are rebuilt, ~7
# minutes on 2 loaded cores, only where their source changed: setup.py keeps one build folder per torch).
TORCH       ?= 2.14.1
TORCH_VENV  := $(VENV)-torch-$(TORCH)
TORCH_STAMP := $(TORCH_VENV)/.polydist-installed

$(TORCH_STAMP): pyproject.toml setup.py $(shell find src/polydist -type f -not -name '*.so' -not -name '_built.json' -not -path '*/__pycache__/*')
	$(PYTHON) -m venv $(TORCH_VENV)
	$(TORCH_VENV)/bin/python -m pip install --quiet torch==$(TORCH) "setuptools>=68"
	$(TORCH_VENV)/bin/python -m pip install --quiet --no-build-isolation torch==$(TORCH) ".[examples,test,ft]"
	touch $(TORCH_STAMP)

$(TORCH_VENV)/mpi/%/.installed: $(TORCH_STAMP) tools/mpi_runtime.sh
	tools/mpi_runtime.sh $(TORCH_VENV)/bin/python $* $(TORCH_VENV)/mpi/$*

test-torch: $(TORCH_STAMP) $(TORCH_VENV)/mpi/openmpi/.installed $(TORCH_VENV)/mpi/impi/.installed
	$(TORCH_VENV)/bin/polydist info | sed -n '/^compiled parts:/,$$p'
	$(TORCH_VENV)/bin/python -m pytest $(SUITE)
	$(TORCH_VENV)/bin/python -m pytest -p no:cacheprovider tests/backends/mpi4py/test_mpi_runtimes.py  # marked system

# The fault-tolerance suite (marker ft; about 4 minutes on 2 cores): whole polydist run --fault-tolerant jobs that lose
# a replica group (SIGKILL, an exception, SIGSTOP, a hang) and go on, on gloo (torchft) and on mpi under Open MPI
# (ULFM, the runtime installed by make mpi-runtimes), and ULFM's primitives. make test runs the adapter's and the
# report's unit tests; make test-system runs the kill and the hang on both, and ULFM's primitives (marked system too).
test-ft: $(STAMP) $(VENV)/mpi/openmpi/.installed
	$(BIN)/python -m pytest -p no:cacheprovider -m ft --durations=10

# The system tests (tests/conftest.py SYSTEM_FILES, about 20 minutes on 2 cores): whole programs under a launcher
# (the main job, the examples and tutorials, restarts, checkpoint and resume, fault scenarios read by polydist trace,
# two nodes on one host, the MPI smoke tests under Open MPI and Intel MPI) and peers' own suites (ignite, PyTorch,
# Accelerate, Fabric). CI runs it after make test.
test-system: $(STAMP) mpi-runtimes
	$(BIN)/python -m pytest -m "system and not engines" --durations=25

# The codec fuzz tests with a long budget (50,000 examples per property, about 5 minutes; make test runs 150).
fuzz: $(STAMP)
	$(BIN)/python -m pytest tests/unit/test_codec_fuzz.py --hypothesis-profile=long -p no:cacheprovider

# Horovod 0.28.1 with Gloo, built for the installed torch (upstream never released the C++17 build fix that
# torch >= 2.1 needs; tools/build_horovod.sh applies it to the registry's source package, ~1.5 min on 2 cores)
# and cached under .venv, so that a second run only installs. Needs g++ and cmake (installed from Debian if missing).
horovod: $(STAMP)
	command -v g++ >/dev/null && command -v cmake >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ cmake)
	tools/build_horovod.sh $(BIN)/python $(VENV)/horovod-wheels

# The horovod backend's tests, Horovod built first: the world tests on horovod worlds (ranks started by
# horovodrun --gloo; POLYDIST_TEST_BACKENDS=horovod), tests/backends/horovod/test_horovod.py and the main job under
# horovodrun; then, in a pytest of its own (the idle Horovod worlds of the first poll their cores), ignite's
# Horovod tests on polydist (tests/third_party/test_ignite_suite.py, phase "horovod"). About 20 minutes.
# make test skips them.
test-horovod: horovod
	POLYDIST_TEST_BACKENDS=horovod $(BIN)/python -m pytest -p no:cacheprovider -k horovod tests \
		--ignore tests/third_party/test_ignite_suite.py
	$(BIN)/python -m pytest -p no:cacheprovider -k horovod tests/third_party/test_ignite_suite.py

# The xla-tpu backend in a venv of its own, $(VENV)-xla: torch_xla's last release, 2.9.0, pins torch 2.9.0,
# whose PyPI wheel pulls ~4 GB of CUDA packages (a 7 GB venv, ~100 s to install with pip's cache warm); the main venv
# keeps torch 2.13.0. Made once (the stamp), like Horovod's wheel; a second make test-xla only runs the tests.
XLA_VENV  := $(VENV)-xla
XLA_STAMP := $(XLA_VENV)/.polydist-installed

xla: $(XLA_STAMP)

$(XLA_STAMP): pyproject.toml
	$(PYTHON) -m venv $(XLA_VENV)
	$(XLA_VENV)/bin/python -m pip install --quiet torch==2.9.0 torch-xla==2.9.0
	$(XLA_VENV)/bin/python -m pip install --quiet torch==2.9.0 torch-xla==2.9.0 -e . pytest pytest-timeout hypothesis \
		pytest-xdist pytorch-ignite==0.5.5 joblib mpi4py mpich
	touch $(XLA_STAMP)

# With PJRT_DEVICE=CPU (world size 1; PJRT's CPU client cannot run several processes): polydist's unit tests, the
# world-size-1 tests (tests/core, tests/backends/xla/test_xla.py), then ignite's own XLA tests (marker tpu) on polydist,
# and the side-by-side count of those tests on ignite itself and on polydist (12-15 minutes on the shared 2-core VM).
# Left out there: two tests that compare a gloo world's whole stdout, where torch 2.9's gloo prints "[Gloo] Rank 0 is
# connected to 1 peer ranks..." itself (torch 2.13's does not); they pass in make test.
XLA_GLOO_STDOUT := tests/core/test_context.py::test_launched_ranks_without_master_meet_on_loopback_15000 \
	tests/core/test_world_state.py::test_destroy_and_reinit_leaves_nothing_stale

test-xla: $(XLA_STAMP)
	PJRT_DEVICE=CPU $(XLA_VENV)/bin/python -m pytest -p no:cacheprovider tests/unit tests/core tests/backends/xla/test_xla.py \
		$(foreach t,$(XLA_GLOO_STDOUT),--deselect $(t))
	PJRT_DEVICE=CPU $(XLA_VENV)/bin/python -m pytest -p no:cacheprovider tests/third_party/test_ignite_suite.py -k xla
	PJRT_DEVICE=CPU $(XLA_VENV)/bin/python tests/third_party/test_ignite_suite.py xla

# DeepSpeed and Ray Train (the engines extra; about 15 s and 20 s to install with the pip cache warm, torch kept
# at 2.13.0) and their jobs on polydist (tests/third_party/test_engines.py, about 2 minutes on 2 cores: each job
# imports DeepSpeed or starts a Ray cluster, which is why make test leaves them out).
ENGINES_STAMP := $(VENV)/.polydist-engines-installed

engines: $(ENGINES_STAMP)

$(ENGINES_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet torch==2.13.0 -e ".[examples,test,engines]"
	touch $(ENGINES_STAMP)

test-engines: $(ENGINES_STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider -m engines tests/third_party/test_engines.py
# The tests marked heavy, which make test skips to keep within its time (about 6 minutes on 2 cores): PyTorch's
# own suite side by side with gloo (make test runs polydist's configurations only), the elastic node-leaves-and-
# joins job, the main job with --fsdp surviving a SIGKILLed rank under --max-restarts, the sharded-training
# tutorial on gloo and the fault benchmark's run.
test-heavy: $(STAMP)
	POLYDIST_TEST_HEAVY=1 $(BIN)/python -m pytest -p no:cacheprovider -m heavy tests

# The scenario table of docs/howto/debugging-a-hang.md (marker hang_table; about 15 minutes on 2 cores): every
# launcher x backend x program x fault of tests/launch/test_hang_table.py, 2 ranks each; each writes the first line
# of its report to build/hang-table/, and tools/hang_table.py puts them into the docs, also when some failed.
# make test runs three of them.
hang-table: $(STAMP)
	rm -rf build/hang-table
	POLYDIST_TEST_HANG_TABLE=1 $(BIN)/python -m pytest -p no:cacheprovider tests/launch/test_hang_table.py; \
		rc=$$?; $(BIN)/python tools/hang_table.py || rc=1; exit $$rc

# Open MPI and Intel MPI beside the venv's MPICH: each in a venv of its own under $(VENV)/mpi that sees the main
# venv's packages (tools/mpi_runtime.sh; a few seconds each once the wheels are downloaded, impi-rt is 130 MB).
RUNTIME_STAMP = $(VENV)/mpi/$(1)/.installed

$(VENV)/mpi/%/.installed: $(STAMP) tools/mpi_runtime.sh
	tools/mpi_runtime.sh $(BIN)/python $* $(VENV)/mpi/$*

mpi-runtimes: $(call RUNTIME_STAMP,openmpi) $(call RUNTIME_STAMP,impi)

# A real Slurm cluster on this machine (tests/cluster/): munged, slurmctld and two slurmd nodes, each node a
# network namespace with its own host name and address, made and torn down by the tests; the jobs users run
# (srun, sbatch, salloc + mpiexec, polydist run and torchrun in a step, srun --mpi=pmi2, failures), the MPI
# backend across the two hosts under MPICH and Open MPI, and tests/collectives' world tests (mpi, gloo) there. Needs root (namespaces); installs Debian's slurm-wlm
# and munge where missing (tools/slurm_install.sh). Checks afterwards that nothing is left running
# (tools/cluster_leftovers.sh). make test skips these tests.
test-slurm: $(STAMP) $(call RUNTIME_STAMP,openmpi)
	tools/slurm_install.sh
	POLYDIST_TEST_SLURM=1 $(BIN)/python -m pytest -p no:cacheprovider --durations=0 tests/cluster; \
		rc=$$?; tools/cluster_leftovers.sh || rc=1; exit $$rc

# Every MPI test under Open MPI or Intel MPI: the world tests on MPI worlds and every test named for MPI,
# run by the runtime's Python, whose mpiexec and libmpi they then use (about 3 minutes each).
test-openmpi test-impi: test-%: $(call RUNTIME_STAMP,%)
	POLYDIST_TEST_BACKENDS=mpi $(VENV)/mpi/$*/bin/python -m pytest -p no:cacheprovider -k mpi tests

# The documentation site (mkdocs.yml, docs/): the docs extra (MkDocs, mkdocstrings, ruff for its signatures,
# Selenium) and Debian's chromium + chromedriver for the check of every page (tests/docs/test_site.py, which
# make test also runs, skipping the browser part where they are missing; its screenshots of every page go to
# build/docs-screenshots/, not into site/). make docs-serve serves site/ on loopback: its links are directory
# URLs, which a browser cannot follow in files opened from disk.
DOCS_STAMP := $(VENV)/.polydist-docs-installed

docs-setup: $(DOCS_STAMP)

$(DOCS_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[examples,test,plot,docs]"
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) || \
		echo "chromium could not be installed: the browser check will skip"
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
	$(BIN)/python -m pytest tests/docs -p no:cacheprovider

docs-serve: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
	$(BIN)/python -m http.server --bind 127.0.0.1 --directory site 8000

clean:
	rm -rf $(VENV) $(VENV)-xla build src/*.egg-info .pytest_cache site
