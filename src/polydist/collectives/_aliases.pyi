# Short names for the stubs beside this file, so that each overload fits on one line (stubs only:
# nothing imports this at run time).

from typing import Literal, Optional

from ..groups import GroupLike

_G = GroupLike
_No = Literal[False]
_Yes = Literal[True]
_P = Optional[bool]  # allow_pickle
