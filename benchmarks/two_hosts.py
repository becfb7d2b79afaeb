"""16 MiB all_reduce busbw across two hosts vs on one host, gloo vs MPI (needs root: network namespaces).

Two hosts are two network namespaces joined by a veth pair (tests/_netns.py; the machine's kernel moves the
bytes, no NIC, so the figures are a ceiling of the set-up, not of a network). 4 ranks, started by the mpich
wheel's mpiexec in every case (its Hydra enters each namespace through ``-launcher-exec``, as ssh would):

* two hosts: 2 ranks on each, every byte between the hosts on the veth pair (UCX limited to TCP: it would
  otherwise use shared memory between namespaces of one machine, which no two real hosts share);
* one host: the 4 ranks on host 0 (MPI: shared memory; gloo: TCP over loopback).

Each rank runs ``polydist bench --no-launch`` (``polydist.all_reduce``, float32, 16 MiB, median of the
timed blocks) on the backend named by ``POLYDIST_BACKEND``; gloo meets at host 0's address.

    sudo .venv/bin/python benchmarks/two_hosts.py --json benchmarks/results/two_hosts_busbw.json
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "tests", "cluster"))

from _cluster import write_enter_host  # noqa: E402
from _netns import TwoHosts  # noqa: E402

BIN = os.path.dirname(sys.executable)


def measure(two, wrapper, backend, layout, size, iters, repeats, out_dir):
    hosts = ",".join(f"{h.hostname}:2" for h in two.hosts) if layout == "two hosts" else f"{two.hosts[0].hostname}:4"
    path = os.path.join(out_dir, f"{backend}-{layout.replace(' ', '_')}.json")
    argv = [os.path.join(BIN, "mpiexec"), "-launcher", "ssh", "-launcher-exec", wrapper, "-hosts", hosts, "-n", "4",
            sys.executable, "-m", "polydist.bench", "--no-launch", "--sizes", size, "-n", str(iters),
            "--repeats", str(repeats), "--json", path, "--quiet"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "GLOO_", "PMI_"))}
    env.update(POLYDIST_BACKEND=backend, MASTER_ADDR=two.hosts[0].addr, MASTER_PORT="29700",
               OMP_NUM_THREADS="1", UCX_TLS="self,tcp")
    tx = [_tx(two, h) for h in two.hosts]
    subprocess.run(two.command(two.hosts[0], argv, own_hostname=True), env=env, cwd=ROOT, check=True, timeout=600)
    sent = [_tx(two, h) - t for h, t in zip(two.hosts, tx)]
    with open(path) as f:
        return json.load(f), sent


def _tx(two, host):
    cmd = two.command(host, ["cat", f"/sys/class/net/{host.ifname}/statistics/tx_bytes"])
    return int(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--size", default="16MiB")
    parser.add_argument("-n", "--iters", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    two = TwoHosts(tag=f"bth{os.getpid() % 100000}", octet=os.getpid() % 250 + 1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            two.setup()
            wrapper = write_enter_host(two, os.path.join(tmp, "enter-host"))
            for layout in ("one host", "two hosts"):
                for backend in ("gloo", "mpi"):
                    result, sent = measure(two, wrapper, backend, layout, args.size, args.iters, args.repeats, tmp)
                    rows.append({"layout": layout, "backend": backend, "veth_tx_bytes": sent, "bench": result})
                    print(f"{layout:9s} {backend:4s} veth bytes sent {sent}  {_summary(result)}", flush=True)
        finally:
            two.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "rows": rows}, f, indent=1)


def _summary(result):
    """The bench JSON's all_reduce record: backend, time and busbw."""
    r = result["records"][0]
    return f"{r['backend']}: {r['time_s'] * 1e3:.1f} ms per call, busbw {r['busbw_GBps']:.2f} GB/s"


if __name__ == "__main__":
    main()
