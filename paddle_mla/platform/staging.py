"""Host<->device transfers of a step without hidden syncs (docs/architecture.md, hot-path rules).

``Uploader``: every small host array of a step (input ids, lengths, block tables, sampling
parameters) is written into ONE pinned host staging buffer and sent with ONE non-blocking copy
into a persistent device byte buffer; each array becomes a typed view of that buffer. A
``.to(device)`` of pageable numpy would instead block the host until the GPU has drained its
queue. Two staging slots alternate, and a slot is rewritten only after the copy that last read it
has finished (an event wait, normally long done), so the host may build step N+1 while step N's
copy is in flight (overlapped scheduling).

``ResultReader``: the step's one device-to-host read, into pinned memory with a non-blocking copy
and an event, so the host can start the next step before it waits (two slots again).

On CPU both degrade to plain copies (nothing to overlap). The buffers grow (doubling) when a step
needs more than they hold, which only happens in the first steps or with long penalty lists.
"""

from __future__ import annotations

import numpy as np

from paddle_mla.platform import runtime as _runtime

_runtime.require_selected(__name__)

import torch  # noqa: E402

_ALIGN = 16
_TORCH_DTYPES = {np.dtype(np.int64): torch.int64, np.dtype(np.int32): torch.int32,
                 np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64,
                 np.dtype(np.bool_): torch.bool}


def _pinned_bytes(n: int, pin: bool):
    t = torch.zeros(n, dtype=torch.uint8)
    return t.pin_memory() if pin else t


def _host_view(t) -> np.ndarray:
    """A numpy array sharing ``t``'s memory (torch); a runtime whose ``.numpy()`` copies gets None."""
    view = t.numpy()
    view[:1] = 1
    shared = int(t[0]) == 1
    view[:1] = 0
    return view if shared else None


def host_values(t) -> np.ndarray:
    """The values of a tensor that already lives on the host (CPU), as numpy, with no transfer. A
    device tensor is refused: the step's one device-to-host read is ``ResultReader``'s, and a
    CPU-only path that reads its routing on the host must not turn into a hidden sync on a GPU."""
    if "cpu" not in str(t.device).lower():
        raise ValueError(f"host_values: a {t.device} tensor would need a device-to-host read")
    return t.numpy()


class _Slot:
    def __init__(self, nbytes: int, pin: bool):
        self.tensor = _pinned_bytes(nbytes, pin)
        self.view = _host_view(self.tensor)
        self.event = None


class Uploader:
    """Stage host arrays, then ``commit()`` sends them all with one copy. Views handed out by
    ``add`` are valid on the device once ``commit`` has been called (stream order)."""

    def __init__(self, device: str, nbytes: int = 1 << 16):
        self.device = device
        self.gpu = not device.startswith("cpu")
        self.nbytes = 0
        self.slots: list[_Slot] = []
        self.dev = None
        self.turn = 0
        self._parts: list[tuple[int, np.ndarray]] = []
        self._used = 0
        self.num_commits = 0      # tests: one upload per step
        self._views: dict = {}
        if self.gpu:
            self._grow(nbytes)

    def _grow(self, nbytes: int) -> None:
        self.nbytes = max(nbytes, 2 * self.nbytes)
        self.slots = [_Slot(self.nbytes, True), _Slot(self.nbytes, True)]
        self.dev = torch.zeros(self.nbytes, dtype=torch.uint8, device=self.device)
        self._views: dict = {}      # views of the old buffer are stale

    def add(self, a: np.ndarray):
        """The device tensor that will hold ``a`` (same dtype and shape) after ``commit``."""
        a = np.ascontiguousarray(a)
        if not self.gpu:
            return torch.from_numpy(a.copy())   # CPU: a private copy (the caller may reuse ``a``)
        start = self._used
        self._used = start + -(-a.nbytes // _ALIGN) * _ALIGN
        self._parts.append((start, a))
        return start, a

    def commit(self, handles: list) -> list:
        """Send everything staged since the last commit; returns the device tensors of ``handles``
        (the values ``add`` returned), in order."""
        self.num_commits += 1
        if not self.gpu:
            return handles
        parts, used = self._parts, self._used
        self._parts, self._used = [], 0
        if used > self.nbytes:
            self._grow(used)
        slot = self.slots[self.turn]
        self.turn ^= 1
        if slot.event is not None:
            slot.event.synchronize()    # the copy that read this slot two commits ago (not a stream sync)
        if slot.view is not None:
            for start, a in parts:
                slot.view[start:start + a.nbytes] = a.view(np.uint8).reshape(-1)
        else:
            for start, a in parts:
                slot.tensor[start:start + a.nbytes].copy_(torch.from_numpy(a.view(np.uint8).reshape(-1).copy()))
        dev = self.dev
        if used:
            dev[:used].copy_(slot.tensor[:used], non_blocking=True)
        slot.event = torch.cuda.Event()
        slot.event.record()
        views, out = self._views, []
        for start, a in handles:
            key = (start, a.dtype, a.shape)
            v = views.get(key)
            if v is None:
                v = views[key] = self._view(start, a)
            out.append(v)
        if len(views) > self._MAX_VIEWS:     # prefill steps vary the shapes: keep the cache bounded
            views.clear()
        return out

    # The typed views of the device buffer, by (offset, dtype, shape): a steady decode step stages
    # the same layout every step, and making a view costs four tensor ops (several us each on the
    # host, a dozen arrays a step). A cached view aliases the same bytes a new one would.
    _MAX_VIEWS = 512

    def _view(self, start: int, a: np.ndarray):
        if not a.size:
            return torch.zeros(a.shape, dtype=_TORCH_DTYPES[a.dtype], device=self.device)
        return self.dev[start:start + a.nbytes].view(_TORCH_DTYPES[a.dtype]).view(a.shape)


class PendingRead:
    """A device tensor on its way to the host; ``wait()`` gives the numpy array (float64 here)."""

    def __init__(self, host, event, n: int, ready: np.ndarray | None = None):
        self.host, self.event, self.n, self.ready = host, event, n, ready

    def wait(self) -> np.ndarray:
        if self.ready is not None:
            return self.ready
        self.event.synchronize()
        return self.host[:self.n].numpy().copy()


class ResultReader:
    """Starts the read of a step's packed float64 result without waiting for it."""

    def __init__(self, device: str, n: int = 4096):
        self.gpu = not device.startswith("cpu")
        self.n = 0
        self.bufs = []
        self.turn = 0
        if self.gpu:
            self._grow(n)

    def _grow(self, n: int) -> None:
        self.n = max(n, 2 * self.n)
        self.bufs = [torch.zeros(self.n, dtype=torch.float64).pin_memory() for _ in range(2)]

    def start(self, packed) -> PendingRead:
        if not self.gpu:
            return PendingRead(None, None, 0, ready=packed.cpu().numpy())
        n = packed.shape[0]
        if n > self.n:
            self._grow(n)
        host = self.bufs[self.turn]
        self.turn ^= 1
        host[:n].copy_(packed, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return PendingRead(host, event, n)
