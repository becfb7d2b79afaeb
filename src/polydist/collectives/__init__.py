"""The collectives and point-to-point calls, with value semantics.

Every call takes the one path of :mod:`~polydist.collectives.pipeline`
(world, or the serial result without a process group → resolve group →
non-member → root check → sequence number → flight recorder → debug
fingerprint → timeout naming → backend). :mod:`~polydist.collectives.reduce` (all_reduce,
reduce, reduce_scatter; numbers in :mod:`~polydist.collectives.numbers`),
:mod:`~polydist.collectives.broadcast` (broadcast, barrier),
:mod:`~polydist.collectives.gather` (all_gather, gather),
:mod:`~polydist.collectives.scatter` (scatter, all_to_all),
:mod:`~polydist.collectives.p2p` (send, recv, isend, irecv). They share
:mod:`~polydist.collectives.frames` (Python values and metadata as byte
slots), :mod:`~polydist.collectives.debug` (fingerprints),
:mod:`~polydist.collectives.timeouts` (naming the ranks that did not arrive),
:mod:`~polydist.collectives.recorder` (the flight recorder)
and :mod:`~polydist.collectives.work` (async handles).
"""
