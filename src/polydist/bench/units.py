"""The benchmark tool's units: :mod:`polydist.units`, kept at this public path (the comms profile uses them too, so they live below both)."""

from ..units import *  # noqa: F401,F403
from ..units import __all__  # noqa: F401
