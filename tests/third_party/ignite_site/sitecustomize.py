"""Makes ``ignite_swap`` reach the Python processes that ignite's tests start themselves.

``test_ignite_suite.py`` puts this folder on their ``PYTHONPATH``, so Python
imports it at start-up: the workers of ``horovod.run`` (which unpickle test
functions from the shipped files), and the scripts that torchrun and
horovodrun start (``check_idist_parallel.py``) then run on polydist too,
not on ignite itself.
"""

import ignite_swap  # noqa: F401 - installs the swap (it is on PYTHONPATH beside this folder)
