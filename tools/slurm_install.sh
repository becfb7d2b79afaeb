#!/bin/sh
# Debian's Slurm (slurm-wlm: slurmctld, slurmd, the clients) and munge, for make test-slurm: installed only
# where one of their commands is missing. The packages' own services are not used (the tests start their
# daemons with a configuration of their own), so nothing is enabled or started here.
set -eu
for cmd in munged slurmctld slurmd srun sbatch salloc scontrol ip; do
    command -v "$cmd" >/dev/null 2>&1 || missing=1
done
[ -z "${missing:-}" ] && exit 0
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge iproute2
