"""Seeing every collective: the flight recorder's dumps, ``polydist trace``, and the comms profile.

The recorder itself is a step of the collective pipeline
(:mod:`polydist.collectives.recorder`): every rank keeps a ring buffer of its
last collectives and point-to-point calls. This package is what reads it:

- :mod:`.dump` writes one rank's buffer and every thread's Python stack to a
  file — on a collective timeout, on a failure under a launcher, on
  ``SIGUSR1``, on ``SIGTERM`` from a launcher stopping the job, and on request
  (:func:`polydist.dump_trace`);
  (:mod:`.torch_records`: what it holds of torch's own recorder; :mod:`.history`:
  what a later dump of a process keeps of its earlier ones);
- :mod:`.reader` reads and checks the dump files (bytes from other ranks are
  checked before use) into the values of :mod:`.records`, and :mod:`.settle`
  gives torch's records of each rank the state all its dumps show together;
- :mod:`.analyze` diagnoses the dumps of all ranks: which ranks wait in
  which collective, which never reached it and where they are instead, and the
  first collective the ranks disagree on (``polydist trace DIR``);
- :mod:`.words` puts those findings in plain sentences;
- :mod:`.chrome` puts every rank's collectives on one Chrome-trace/Perfetto timeline;
- :mod:`.fr_export` writes the dumps in the format of PyTorch's Flight Recorder
  analyser (``polydist trace DIR --fr-trace OUT``, then
  ``python -m torch.distributed.flight_recorder.fr_trace OUT``);
- :mod:`.profile` gathers every rank's calls into a comms profile
  (:func:`polydist.comms_profile`, ``polydist run --profile-comms``), and
  :mod:`.profile_stats` sums them per collective and size, with algbw/busbw
  and stragglers, into its table.

Dump format (``polydist-trace`` version 1)
------------------------------------------

One JSON file per rank, ``rank<R>.json`` (R: the global rank), in the trace
directory (``$POLYDIST_TRACE_DIR``, set by ``polydist run --trace-dir``).
A later dump of the same rank replaces it (written to a temporary file, then
renamed); a later dump of the same process carries what the earlier ones
showed (``earlier``, below). The object::

    {
      "format": "polydist-trace", "version": 1,
      "rank": 2, "world_size": 4, "local_rank": 2,   # world_size, local_rank: null when unknown
      "host": "node1", "pid": 4242,
      "backend": "gloo",                  # the default group's, or null
      "reason": "timeout",                # timeout | exception | signal | terminate | request
      "time": 1764000000.25,              # when the dump was written (time.time(), s)
      "error": "CollectiveTimeoutError: ...",   # "Type: message" of the error that caused the dump, or null
      "traceback": "Traceback (most ...",       # that error's formatted traceback, or null
      "error_frames": [FRAME, ...],             # that error's traceback, outermost first ([] without one)
      "enabled": true,                    # false: POLYDIST_TRACE=0, entries is empty
      "dropped": 0,                       # older entries the ring buffer no longer holds
      "entries": [ENTRY, ...],            # oldest first
      "stacks": [STACK, ...],             # every thread of the process
      "torch": TORCH,                     # torch's own flight recorder; null where this torch has none
      "earlier": [EARLIER, ...]           # this process's earlier dumps to this file, oldest first (the last 8)
    }

ENTRY (one call)::

    {
      "id": 17,                           # this rank's record number, from 0, increasing
      "collective": "all_reduce",         # the public name; point-to-point: "send", "recv"
      "group": [0, 1, 2, 3],              # global ranks of the group, in group-rank order
      "seq": 41,                          # the group's collective number (debug/timeout numbering); null for p2p
      "op": "SUM",                        # reduction op, else null
      "root": null,                       # src/dst (global rank); the peer for send/recv
      "dtypes": ["float32"],              # of the tensor arguments, in order; [] for Python values
      "shapes": [[4, 2]],                 # one per dtype
      "bytes": 32,                        # tensor bytes this rank passed in (0 for values)
      "value": false,                     # the call carried Python values (numbers, strings, objects)
      "async": false,                     # async_op=True / isend / irecv: "end" is when wait() returned
      "file": "/home/u/train.py", "line": 88, "function": "main",  # the caller outside polydist
      "start": 1764000000.01,             # time.time() at entry, s
      "end": null,                        # time.time() at completion, s; null while not completed
      "state": "started",                 # started | completed | failed
      "error": null                       # the exception's "Type: message" when failed
    }

STACK (one thread; frames outermost first)::

    {"thread": "MainThread", "ident": 1401, "main": true, "frames": [FRAME, ...]}

FRAME::

    {"file": "train.py", "line": 95, "function": "main", "code": "loss = step(batch)"}

TORCH: what torch's flight recorder (``TORCH_FR_BUFFER_SIZE``) holds of the
operations of its C++ backends, gloo and nccl, whoever called them (DDP's
all-reduces, FSDP2's all-gathers, polydist's own calls on those backends too)::

    {
      "buffer": 2000,                     # TORCH_FR_BUFFER_SIZE in this process; 0: the recorder is off
      "groups": {"0": [0, 1, 2, 3], "1": [0, 1]},   # each live group's global ranks, by torch's group name
      "entries": [TORCH_ENTRY, ...]       # oldest first
    }

TORCH_ENTRY: torch's own fields (``torch/distributed/flight_recorder``), of
which the dump keeps ``record_id``, ``pg_id``, ``process_group`` (``[name,
desc]``), ``collective_seq_id``, ``p2p_seq_id``, ``is_p2p``,
``profiling_name`` (``"gloo:all_reduce"``), ``input_sizes``,
``input_dtypes``, ``output_sizes``, ``output_dtypes``, ``state``,
``retired`` (the operation returned, completed or failed), ``timeout_ms``,
``time_created_ns``, ``time_discovered_started_ns``,
``time_discovered_completed_ns``, ``frames`` (the innermost 24, innermost
first: ``{"name", "filename", "line"}``), and ``recorder``
(``"_dump_fr_trace"``: gloo's; ``"_dump_nccl_trace"``: NCCL's). gloo on CPU
leaves ``state`` at ``"scheduled"`` and the discovered times null; ``retired``
says whether it returned.

EARLIER: what an earlier dump of the same process showed that a later one may
not (one failure often dumps a rank several times: the launcher's SIGUSR1
while it waits for a frozen peer, its own exception once that peer is killed,
the launcher's SIGTERM)::

    {
      "reason": "signal", "time": 1764000000.1, "error": null,   # as in that dump
      "stack": [FRAME, ...],              # its main thread's frames, outermost first
      "torch_waiting": [[5, 1764000000000000000]]   # torch's entries not returned then:
    }                                               #   [record_id, time_created_ns], ...

A later dump's torch entries keep the frames an earlier one symbolized. The
reader takes each of torch's operations in its most informative state
(:mod:`.settle`): one that a dump showed waiting stays so unless a later
record shows it completed, and one a backend error failed reads failed.

A dump without an error of its own (a launcher's SIGTERM after a timeout)
repeats the last error this process dumped, so the cause is not lost. The
watcher thread that writes signal-time dumps and the dump's own frames are
left out of the stacks.

Times are wall-clock seconds since the epoch: ranks on one node share the
clock; across nodes they are as close as the nodes' clocks.
"""
