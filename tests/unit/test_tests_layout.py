"""The test tree's own rule: backend tests live in tests/backends/<name>/, never directly in tests/backends/.

pytest (rootdir-relative "prepend" imports) puts the folder of a test module
without ``__init__.py`` on ``sys.path``. A module directly in tests/backends/
would put that folder there, and its sub-folder ``horovod/`` (or
``mpi4py/``) would then import as a namespace package wherever the real one
is not installed: ``importlib.util.find_spec("horovod")`` would say Horovod is
there, and the backend's availability checks would be wrong.
"""
import importlib.util
from pathlib import Path

BACKENDS = Path(__file__).resolve().parents[1] / "backends"


def test_no_test_module_directly_in_tests_backends():
    assert sorted(p.name for p in BACKENDS.glob("*.py")) == []


def test_the_backend_test_folders_shadow_no_package():
    for folder in (p for p in BACKENDS.iterdir() if p.is_dir()):
        spec = importlib.util.find_spec(folder.name)
        origin = [] if spec is None else list(spec.submodule_search_locations or []) + [spec.origin or ""]
        assert not any(str(BACKENDS) in str(place) for place in origin), (folder.name, origin)
