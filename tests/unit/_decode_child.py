"""Child process for the codec fuzz tests: decodes payloads from stdin under a memory limit.

Protocol (binary, on stdin/stdout): the parent writes a 4-byte little-endian
length and the payload; the child, once it has imported torch and polydist,
writes ``ready``, then answers each payload with one line: ``ok <bytes>`` (the value
decoded; ``<bytes>`` is the total size of the tensors and arrays in it),
``ValueError``, ``TypeError``, or ``other <type>: <message>`` for any other
exception. A crash, a hang (the parent's timeout) or exceeding the memory
limit (``MemoryError`` is reported as ``other``) fails the test in the parent.
"""

import resource
import sys

import numpy as np
import torch

import _codec_classes  # allows the classes the fuzz tests send, as the parent does
from polydist import codec

LIMIT_BYTES = 512 * 2**20  # on top of what the interpreter, torch and numpy already map


def _nbytes(x) -> int:
    total, stack = 0, [x]
    while stack:  # iterative: decoded values may nest 1024 deep
        x = stack.pop()
        if isinstance(x, (torch.Tensor, np.ndarray)):
            total += x.nbytes
        elif isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, (list, tuple, set, frozenset)):
            stack.extend(x)
        elif isinstance(x, _codec_classes.Record):
            stack.extend((x.a, x.b))
    return total


def main() -> None:
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmData:"))
    resource.setrlimit(resource.RLIMIT_DATA, (vm + LIMIT_BYTES, vm + LIMIT_BYTES))
    stdin, stdout = sys.stdin.buffer, sys.stdout
    print("ready", file=stdout, flush=True)  # imports done: the parent times answers from here
    while True:
        head = stdin.read(4)
        if len(head) < 4:
            return
        data = stdin.read(int.from_bytes(head, "little"))
        try:
            answer = f"ok {_nbytes(codec.decode(data))}"
        except ValueError:
            answer = "ValueError"
        except TypeError:
            answer = "TypeError"
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails
            answer = f"other {type(exc).__name__}: {exc}".replace("\n", " ")
        stdout.write(answer + "\n")
        stdout.flush()


if __name__ == "__main__":
    main()
