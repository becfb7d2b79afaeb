"""Classes allowed in polydist's codec for the codec's tests, imported by the tests and by the fuzz tests' decoding child
(so both sides allow the same names: ``_codec_classes.Record``...)."""

import dataclasses
import enum
import typing

from polydist import codec


@codec.allow
@dataclasses.dataclass
class Record:
    a: typing.Any
    b: typing.Any = None
    c: int = dataclasses.field(default=0, init=False)  # not an init field: never sent, never set from the wire


@codec.allow
class Row(typing.NamedTuple):
    x: typing.Any
    y: typing.Any = 0


@codec.allow
class Mode(enum.Enum):
    TRAIN = "train"
    EVAL = (1, 2)


@codec.allow
class Bits(enum.IntFlag):
    A = 1
    B = 2
