#!/bin/sh
# After make test-slurm: fails, listing them, if any of its daemons, network namespaces (named slm<pid>a/b,
# mp<pid>a/b) or working directories are left. Reads only; stops nothing.
left=$(ps -eo pid,args | grep -E 'polydist-slurm-' | grep -v -E 'grep|cluster_leftovers')
ns=$(ip netns list 2>/dev/null | grep -E '^(slm|mpx)[0-9]+[ab]( |$)')
dirs=$(ls -d /tmp/polydist-slurm-* 2>/dev/null)
[ -z "$left$ns$dirs" ] && { echo "test-slurm: nothing left running"; exit 0; }
echo "test-slurm left behind:"; printf '%s\n' "$left" "$ns" "$dirs" | grep -v '^$'
exit 1
