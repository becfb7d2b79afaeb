"""Stand-ins for torchft's Manager and its group, for the adapter's one-process tests."""

import torch


class _Work:
    def __init__(self, error=None, fill=None):
        self.future = torch.futures.Future()
        self.error, self.fill = error, fill

    def get_future(self):
        return self.future


class _Group:
    def __init__(self, error_on_start=None, error=None, fill=None):
        self.error_on_start, self.error, self.fill, self.works = error_on_start, error, fill, []

    def allreduce(self, tensors, opts):
        if self.error_on_start is not None:
            raise self.error_on_start
        work = _Work(self.error, self.fill)
        self.works.append((tensors, work))
        return work


class _Manager:
    """What comm_hook asks of torchft's Manager (its private group too), with its error reporting."""

    def __init__(self, group, participants=2, participating=True):
        self._pg, self.participants, self.participating, self.reported = group, participants, participating, []

    def errored(self):
        return self.reported[-1] if self.reported else None

    def wait_quorum(self):
        pass

    def num_participants(self):
        return self.participants

    def is_participating(self):
        return self.participating

    def report_error(self, exc):
        self.reported.append(exc)


class _Summing:
    """A group whose all-reduce completes at once: it adds what ``others`` returns for the buffer (the other
    replica groups' contributions), or fails with ``error``."""

    def __init__(self, others=None, error=None):
        self.others, self.error, self.sent = others, error, []

    def allreduce(self, tensors, opts):
        (buffer,) = tensors
        self.sent.append(buffer.clone())
        work = _Work()
        if self.error is not None:
            work.future.set_exception(self.error)
        else:
            buffer.add_(self.others(buffer))
            work.future.set_result([buffer])
        return work
