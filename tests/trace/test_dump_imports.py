"""A dump with torch's call stacks (a rank's own error or timeout) does not import torch._inductor where nothing
did: symbolizing the stacks asks ``hasattr(torch, "_inductor")``, whose lazy import (with torch._dynamo) took
1-4 s while the other ranks waited for the failed one to end. The frames are the same."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(120)

SCRIPT = textwrap.dedent(
    """
    import json, os, socket, sys
    os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    import torch, torch.distributed as dist
    from polydist import _torch

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    if sys.argv[1] == "inductor":
        import torch._inductor  # a program that compiled: left as it is
    dist.all_reduce(torch.ones(4))  # the line the entry's frames must name
    dumps = _torch.fr_dumps(stacks=True)
    frames = [f for d in dumps for e in d["entries"] for f in e["frames"]]
    print(json.dumps({"inductor": "torch._inductor" in sys.modules, "dynamo": "torch._dynamo" in sys.modules,
                      "lazy": "_inductor" in torch._lazy_modules,
                      "lines": [f["line"] for f in frames if f["filename"] == __file__], "frames": frames}),
          flush=True)
    os._exit(0)  # not the interpreter's exit, where gloo aborts now and then (polydist._at_exit)
    """
)


@pytest.mark.parametrize("program", ["plain", "inductor"])
def test_torch_stacks_without_importing_inductor(tmp_path, program):
    script = tmp_path / "fr.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script), program], capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    line = SCRIPT.splitlines().index(next(x for x in SCRIPT.splitlines() if "the line the entry's" in x)) + 1
    assert seen["lines"] == [line], seen["frames"]  # symbolized: the user's line of the all_reduce
    assert seen["lazy"]  # torch's lazy modules put back as they were
    if program == "plain":
        assert not seen["inductor"] and not seen["dynamo"]
    else:
        assert seen["inductor"]
