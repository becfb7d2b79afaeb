"""The benchmark tool, an application on top of the library.

:mod:`~polydist.bench.timing` is the timing harness (interleaved candidates,
max over ranks), :mod:`~polydist.units` the sizes and algbw/busbw,
:mod:`~polydist.bench.records` the records, tables and JSON;
:mod:`~polydist.bench.cli` is ``polydist bench``, with its command line in
:mod:`~polydist.bench.config`, its timed calls in
:mod:`~polydist.bench.calls`, and its report and plot in
:mod:`~polydist.bench.report`.
"""
