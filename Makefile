# Two commands set up a fresh machine: `make demo` (the main job) and `make test`.
# Both create .venv, install torch==2.13.0 first (the CPU build; any other torch
# request would pull several GB of CUDA packages), then polydist with its extras.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.polydist-installed

.PHONY: demo test fuzz setup docs docs-setup horovod test-horovod mpi-runtimes test-openmpi test-impi engines test-engines test-heavy clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[examples,test]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/polydist run --nproc-per-node 2 examples/train_digits.py

# The whole suite, with the MPI smoke tests also under Open MPI and Intel MPI (tests/backends/test_mpi_runtimes.py);
# it prints its 25 slowest tests. What belongs in it, and the heavier targets below: docs/contributing.md.
test: $(STAMP) mpi-runtimes
	$(BIN)/python -m pytest --durations=25

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
# horovodrun --gloo; POLYDIST_TEST_BACKENDS=horovod) and tests/backends/test_horovod.py (about 6 minutes).
# make test skips them.
test-horovod: horovod
	POLYDIST_TEST_BACKENDS=horovod $(BIN)/python -m pytest -p no:cacheprovider -k horovod tests

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

# Open MPI and Intel MPI beside the venv's MPICH: each in a venv of its own under $(VENV)/mpi that sees the main
# venv's packages (tools/mpi_runtime.sh; a few seconds each once the wheels are downloaded, impi-rt is 130 MB).
RUNTIME_STAMP = $(VENV)/mpi/$(1)/.installed

$(VENV)/mpi/%/.installed: $(STAMP) tools/mpi_runtime.sh
	tools/mpi_runtime.sh $(BIN)/python $* $(VENV)/mpi/$*

mpi-runtimes: $(call RUNTIME_STAMP,openmpi) $(call RUNTIME_STAMP,impi)

# Every MPI test under Open MPI or Intel MPI: the world tests on MPI worlds and every test named for MPI,
# run by the runtime's Python, whose mpiexec and libmpi they then use (about 3 minutes each).
test-openmpi test-impi: test-%: $(call RUNTIME_STAMP,%)
	POLYDIST_TEST_BACKENDS=mpi $(VENV)/mpi/$*/bin/python -m pytest -p no:cacheprovider -k mpi tests

# The documentation site (mkdocs.yml, docs/): the docs extra and Debian's chromium + chromedriver for the
# browser check (tests/docs/test_site.py, which make test also runs, skipping it where they are missing).
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

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache site
