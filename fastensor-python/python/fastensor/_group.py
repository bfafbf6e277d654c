"""Loads by the ranks of a ``torch.distributed`` process group (``process_group=`` of the
torch loads): every rank calls the load with the same checkpoint and gets the whole result,
bit for bit what a single process loads, while each byte is read from storage by one rank.

How a group load runs, on every rank:

1. **Open and compare.** Each rank opens the checkpoint (one header read) and the ranks
   exchange, in one small collective, whether they could, the header's digest, the
   location and the host: a rank that could not open it, or ranks whose location or digest
   differ, make every rank raise before any data moves, naming the file and the rank (the
   details then go round as objects).
2. **Decide.** Whether the group reads once and broadcasts or every rank reads on its own
   (``group_read=`` or ``$FASTENSOR_GROUP_READ`` forces either): the engine's rule, the same
   on every rank (one host reading local files: the page cache is shared, so every rank
   reads), or else rank 0's choice from what its engine learned of earlier group loads in
   the same context (``Engine.choose_group_read`` in Rust; the time of each load teaches
   it), broadcast to the others.
3. **Move.** Reading once: the plan (Rust, the same on every rank) gives each rank a
   contiguous share of the bytes, cut into messages; each rank reads its messages on a
   thread of its own, straight into the tensors' memory where it can, and each message is
   broadcast by the group's own collectives (gloo on the CPU, NCCL on GPUs) as soon as it
   is read, while the reads of the next go on. Staging memory (messages of several small
   tensors, and host copies on the way to a GPU) is bounded by :data:`WINDOW` plus
   :data:`READ_AHEAD` messages.
4. **Agree.** The ranks exchange whether any failed (one integer); a rank whose read failed
   (a checksum, a disk) makes every rank raise, naming it. A rank that dies makes the
   others' collectives fail: they raise :class:`~fastensor.errors.GroupError` within the
   group's timeout.

Where every rank reads on its own whatever the others say (``group_read="each"``, or the
rule with every rank on one host as ``LOCAL_WORLD_SIZE`` tells), steps 1 and 4 are one: the
ranks load, then compare in one small collective, and raise together as above.

Every rank must make the same group calls in the same order (as with any collective).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from . import _native, errors
from ._torch_dtypes import torch_dtype, torch_shape

#: The environment switch that forces a way for every group load: ``broadcast``, ``each``
#: or ``auto`` (the default).
GROUP_READ_ENV = "FASTENSOR_GROUP_READ"

#: Broadcasts in flight at most (each staged message holds at most 16 MiB of staging).
WINDOW = 8

#: How far ahead of the broadcasts a rank reads messages that need staging (messages read
#: straight into their tensors are read as far ahead as the readers get).
READ_AHEAD = 8

#: Threads reading a rank's messages (each read is one engine job with I/O in parallel;
#: two keep the storage busy between one message's read and the next's).
READERS = 2

#: The ways a group may read (``auto``: the engine decides).
WAYS = ("auto", "broadcast", "each")

#: The way the last group load of this process read (``None`` before any): for reports.
last_way: str | None = None


def _dist():
    import torch.distributed as dist

    return dist


class Group:
    """A process group as a load sees it: this process's rank, the size, and the group's
    collectives with their failures turned into fastensor errors naming ``path``."""

    def __init__(self, pg, path: str):
        dist = _dist()
        if not dist.is_available() or not dist.is_initialized():
            raise errors._invalid(
                f"{path}: process_group= needs torch.distributed initialised"
                " (torch.distributed.init_process_group)",
                path,
            )
        self.pg = pg
        self.path = path
        self.rank = dist.get_rank(pg)
        self.size = dist.get_world_size(pg)
        if self.rank < 0:
            raise errors._invalid(f"{path}: this process is not in the process group", path)
        #: Where the group's collectives take tensors (see ``_collective_device``).
        self.device = _collective_device(pg, "cpu")

    def global_rank(self, rank: int) -> int:
        """The default group's rank of this group's ``rank``."""
        dist = _dist()
        if self.pg is None or self.pg is dist.group.WORLD:
            return rank
        return dist.get_global_rank(self.pg, rank)

    def _failed(self, what: str, exc: BaseException) -> errors.GroupError:
        err = errors.GroupError(
            f"{self.path}: the process group failed during {what} (rank {self.rank} of"
            f" {self.size}; another rank died or timed out?): {exc}"
        )
        err.path = self.path
        return err

    def gather_ints(self, values: list[int], what: str) -> list[list[int]]:
        """``values`` (signed 64-bit integers, as many on every rank) of every rank, by rank:
        one collective on a small tensor, far cheaper than :meth:`gather` of objects."""
        mine = torch.tensor(values, dtype=torch.int64, device=self.device)
        out = [torch.empty_like(mine) for _ in range(self.size)]
        try:
            _dist().all_gather(out, mine, group=self.pg)
        except Exception as exc:
            raise self._failed(what, exc) from exc
        return [t.tolist() for t in out]

    def any(self, flag: bool, what: str) -> bool:
        """Whether ``flag`` is true on any rank (one collective on one integer)."""
        t = torch.tensor([1 if flag else 0], dtype=torch.int64, device=self.device)
        try:
            _dist().all_reduce(t, op=_dist().ReduceOp.MAX, group=self.pg)
        except Exception as exc:
            raise self._failed(what, exc) from exc
        return bool(t.item())

    def gather(self, obj: Any, what: str) -> list[Any]:
        """``obj`` of every rank, by rank."""
        out: list[Any] = [None] * self.size
        try:
            _dist().all_gather_object(out, obj, group=self.pg)
        except Exception as exc:
            raise self._failed(what, exc) from exc
        return out

    def broadcast_int(self, value: int, src: int, what: str) -> int:
        """Rank ``src``'s ``value`` (a signed 64-bit integer), on every rank."""
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        try:
            _dist().broadcast(t, src=self.global_rank(src), group=self.pg)
        except Exception as exc:
            raise self._failed(what, exc) from exc
        return int(t.item())

    def broadcast(self, buf: torch.Tensor, src: int, what: str):
        """Starts the broadcast of ``buf`` from rank ``src``; returns its work."""
        try:
            return _dist().broadcast(buf, src=self.global_rank(src), group=self.pg, async_op=True)
        except Exception as exc:
            raise self._failed(what, exc) from exc

    def wait(self, work, what: str) -> None:
        try:
            work.wait()
        except Exception as exc:
            raise self._failed(what, exc) from exc


def _hash(text: str) -> int:
    """A stable 64-bit hash of ``text`` (the same in every process)."""
    import hashlib

    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def _signed(value: int) -> int:
    """``value`` (0 to 2**64 - 1) as the signed 64-bit integer of the same bits."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _describe(exc: BaseException | None) -> tuple[str, str] | None:
    """What other ranks need to raise ``exc`` again: its class name and message."""
    if exc is None:
        return None
    return (type(exc).__name__, str(exc))


class _PeerFailed(Exception):
    """Another rank failed before any bytes moved: this rank stops with the group (and then
    raises that rank's error)."""


def _together(group: Group, own: BaseException | None, what: str) -> None:
    """Every rank goes on only if every rank got here well (one small collective): raises
    ``own`` on a rank that failed, :class:`_PeerFailed` on the others."""
    if group.any(own is not None, what):
        raise own if own is not None else _PeerFailed()


def _raise_for(group: Group, reports: list[tuple[str, str] | None], own: BaseException | None):
    """Raises on every rank when any rank failed: a failed rank its own error, the others
    the first failure's class (a fastensor error class, else ``GroupError``), naming the
    rank and the file."""
    failed = [(r, rep) for r, rep in enumerate(reports) if rep and rep[0] != "_PeerFailed"]
    if not failed:
        return
    if own is not None and not isinstance(own, _PeerFailed):
        raise own
    r, (cls_name, msg) = failed[0]
    cls = getattr(errors, cls_name, None)
    if not (isinstance(cls, type) and issubclass(cls, errors.FastensorError)):
        cls = errors.GroupError
    others = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
    exc = cls(f"rank {r} of {group.size} failed to load {group.path}{others}: {msg}")
    exc.path = group.path
    raise exc


def way_asked(way: str | None) -> str:
    """The way asked for: ``way``, else ``$FASTENSOR_GROUP_READ``, else ``auto``."""
    chosen = way if way is not None else os.environ.get(GROUP_READ_ENV, "") or "auto"
    if chosen not in WAYS:
        raise ValueError(f"group_read must be one of {', '.join(WAYS)}; got {chosen!r}")
    return chosen


class Opened:
    """A checkpoint opened by every rank of a group and found the same on all: the native
    file, its entries, and the way the group reads it."""

    def __init__(
        self,
        group: Group,
        file,
        way: str,
        hosts: int,
        nbytes: int,
        engine,
        via: torch.device,
        learns: bool,
    ):
        self.group = group
        self.file = file
        self.entries = file.entries()
        self.way = way
        self.hosts = hosts
        self.nbytes = nbytes
        self.engine = engine
        #: Where the group's collectives move bytes (see ``_collective_device``).
        self.via = via
        #: Whether the engine chose the way (and so learns from the loads' times).
        self.learns = learns


def open_group(
    engine,
    pg,
    path: str,
    open_file: Callable[[], Any],
    device: str | torch.device,
    way: str | None,
    prepare: Callable[[Any], Any] | None = None,
) -> tuple[Opened, Any]:
    """Opens ``path`` on every rank of ``pg`` (``open_file()``) and checks that all opened
    the same checkpoint; ``prepare(file)`` (checks of the caller's own, run before the
    exchange so that its failure reaches every rank) gives the second value returned.

    Raises on every rank: the error of a rank that failed (its own on that rank; the same
    class naming it on the others); :class:`~fastensor.errors.InvalidInputError` when ranks
    opened different checkpoints.
    """
    group = Group(pg, path)
    asked = way_asked(way)
    file = prepared = None
    own: BaseException | None = None
    digest, nbytes = 0, 0
    try:
        file = open_file()
        digest = _native.source_digest(file)
        nbytes = sum(e[4] for e in file.entries())
        if prepare is not None:
            prepared = prepare(file)
    except Exception as exc:
        own = exc
    hosts = _agree(group, path, digest, own, "the opening exchange")
    dev = torch.device(device)
    via = _collective_device(pg, dev)
    cuda = dev.type == "cuda"
    if via.type != dev.type:  # the collectives cannot reach this memory: every rank reads
        if asked == "broadcast":
            raise errors._invalid(
                f"{path}: this process group's collectives cannot move {dev.type} memory", path
            )
        chosen = "each"
    elif asked != "auto":
        chosen = asked
    else:  # the rule is the same on every rank; else rank 0 chooses and says so
        chosen = _native.group_rule(path, group.size, hosts, nbytes, cuda)
        if chosen is None:
            if group.rank == 0:
                chosen, _, _ = _native.group_choose(engine, path, group.size, hosts, nbytes, cuda)
            said = group.broadcast_int(WAYS.index(chosen) if chosen else 0, 0, "the way")
            chosen = WAYS[said]
    learns = asked == "auto" and via.type == dev.type
    return Opened(group, file, chosen, hosts, nbytes, engine, via, learns), prepared


def finish(opened: Opened, own: BaseException | None, started: float, device, nbytes: int) -> None:
    """The closing exchange: every rank raises when any failed; when the engine chose the
    way, every rank teaches its engine the time of the load of ``nbytes`` (from ``started``,
    ``time.perf_counter()``), so that whichever rank's profile is saved knows it."""
    group = opened.group
    if group.any(own is not None, "the closing exchange"):
        reports = group.gather(_describe(own), "the closing exchange")
        _raise_for(group, reports, own)
    if opened.learns:
        cuda = torch.device(device).type == "cuda"
        _native.group_record(
            opened.engine,
            group.path,
            group.size,
            opened.hosts,
            nbytes,
            cuda,
            opened.way,
            time.perf_counter() - started,
        )


def run(
    opened: Opened,
    started: float,
    device,
    each: Callable[[], Any],
    broadcast: Callable[[], Any],
    nbytes: int | None = None,
) -> Any:
    """Runs the load the way chosen (``each()`` or ``broadcast()``), then the closing
    exchange; returns what the way returned. ``nbytes``: the bytes loaded (default: the
    whole checkpoint)."""
    global last_way
    last_way = opened.way
    own: BaseException | None = None
    out = None
    try:
        out = each() if opened.way == "each" else broadcast()
    except errors.GroupError:
        raise  # the group is broken: no closing exchange can run
    except Exception as exc:
        own = exc
    finish(opened, own, started, device, opened.nbytes if nbytes is None else nbytes)
    return out


def _flat(t: torch.Tensor) -> torch.Tensor:
    """The bytes of contiguous ``t`` as a flat ``uint8`` tensor over the same memory."""
    return t.reshape(-1).view(torch.uint8)


def new_tensors(opened: Opened, indices: list[int], device) -> dict[int, torch.Tensor]:
    """A new tensor for each entry ``indices`` of ``opened`` on ``device`` (by index)."""
    out = {}
    for i in indices:
        name, dtype, shape, _, _ = opened.entries[i]
        dt = torch_dtype(opened.group.path, name, dtype)
        out[i] = torch.empty(torch_shape(dtype, shape), dtype=dt, device=device)
    return out


def broadcast_into(
    opened: Opened,
    dests: dict[int, torch.Tensor],
    verify: bool,
) -> None:
    """Fills ``dests`` (entry index -> contiguous tensor of the entry's bytes, on the CPU or
    a CUDA device) with the entries' bytes: each rank reads its messages of the plan and
    broadcasts them (see the module's documentation)."""
    group = opened.group
    indices = sorted(dests)
    plan = _native.group_plan(opened.file, group.size, not verify, indices)
    flats = {i: _flat(t) for i, t in dests.items() if opened.entries[i][4]}
    device = next(iter(dests.values())).device if dests else torch.device("cpu")
    on_cpu = device.type == "cpu"
    mine = [k for k, m in enumerate(plan) if m[0] == group.rank]

    def direct(m) -> bool:
        return on_cpu and len(m[4]) == 1

    ready: dict[int, BaseException | None] = {}
    cond = threading.Condition()
    staged: dict[int, torch.Tensor] = {}
    stop = threading.Event()
    todo = iter(mine)
    failed: list[BaseException] = []
    progress = [0]  # the plan index of the next broadcast this rank starts

    def read_staged(f: int, start: int, end: int, pieces) -> torch.Tensor:
        """A message's bytes read into new host memory, one span a piece (so that a verified
        file checks each whole tensor), then moved to the device."""
        host = torch.empty(end - start, dtype=torch.uint8)
        spans, at = [], 0
        for _, a, b in pieces:
            spans.append((f, start + at, start + at + (b - a), host, at))
            at += b - a
        _native.read_spans(opened.file, spans)
        return host if on_cpu else host.to(device)

    def reader() -> None:
        """Reads this rank's messages in plan order (several readers take turns); a staged
        message waits until it is among the next READ_AHEAD broadcasts, which bounds the
        staging memory read ahead."""
        while True:
            with cond:
                k = next(todo, None)
                if k is None:
                    return
                m = plan[k]
                if not direct(m):
                    while k >= progress[0] + READ_AHEAD and not stop.is_set():
                        cond.wait()
                err = failed[0] if failed else None
            _, f, start, end, pieces = m
            if err is None and not stop.is_set():
                try:
                    if direct(m):
                        t, a, b = pieces[0]
                        _native.read_spans(opened.file, [(f, start, end, flats[t][a:b], 0)])
                    else:
                        staged[k] = read_staged(f, start, end, pieces)
                except Exception as exc:
                    err = exc
            with cond:
                if err is not None and not failed:
                    failed.append(err)
                ready[k] = err
                cond.notify_all()

    threads = [
        threading.Thread(target=reader, name="fastensor-group-reader", daemon=True)
        for _ in range(READERS)
    ]
    for th in threads:
        th.start()
    pending: deque = deque()
    own: BaseException | None = None

    def complete() -> None:
        work, k, buf = pending.popleft()
        group.wait(work, "a broadcast")
        m = plan[k]
        if direct(m):
            return
        at = 0
        for t, a, b in m[4]:
            flats[t][a:b].copy_(buf[at : at + (b - a)])
            at += b - a
        staged.pop(k, None)

    try:
        for k, m in enumerate(plan):
            owner, _, start, end, pieces = m
            with cond:
                progress[0] = k
                cond.notify_all()
            if owner == group.rank:
                while True:
                    with cond:
                        if k in ready or (cond.wait(0.02) and k in ready):
                            break
                    if pending:
                        complete()  # the oldest broadcast, while the read goes on
                err = ready[k]
                own = own or err
                if direct(m):
                    t, a, b = pieces[0]
                    buf = flats[t][a:b]
                else:
                    buf = staged.get(k)
                    if buf is None:  # the read failed: broadcast anything of the size
                        buf = torch.zeros(end - start, dtype=torch.uint8, device=device)
            elif direct(m):
                t, a, b = pieces[0]
                buf = flats[t][a:b]
            else:
                buf = torch.empty(end - start, dtype=torch.uint8, device=device)
            pending.append((group.broadcast(buf, owner, "a broadcast"), k, buf))
            while len(pending) > WINDOW:
                complete()
        while pending:
            complete()
    finally:
        stop.set()
        with cond:
            cond.notify_all()
        for th in threads:
            th.join()
    if own is not None:
        raise own


def _collective_device(pg, device) -> torch.device:
    """Where the group's collectives can move bytes: CUDA memory for an NCCL group, host
    memory otherwise."""
    backend = str(_dist().get_backend(pg)).lower()
    if "nccl" in backend and "gloo" not in backend:
        dev = torch.device(device)
        return dev if dev.type == "cuda" else torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _broadcast_new(
    opened: Opened, indices: list[int], verify: bool, device: torch.device
) -> dict[str, torch.Tensor]:
    """The entries ``indices`` in new tensors on ``device``, read once and broadcast (the
    ranks agree first that every one could allocate them)."""
    dests, own = {}, None
    try:
        dests = new_tensors(opened, indices, opened.via)
    except Exception as exc:
        own = exc
    _together(opened.group, own, "the allocation")
    broadcast_into(opened, dests, verify)
    out = {opened.entries[i][0]: dests[i] for i in indices}
    return out if opened.via == device else {k: v.to(device) for k, v in out.items()}


def _each_known(pg, path: str, way: str | None) -> bool:
    """Whether every rank will read on its own whatever the others say: asked so, or the
    engine's rule for ranks that all share one host (``LOCAL_WORLD_SIZE``, as torchrun sets
    it, equal to the world's size), the same on every rank."""
    asked = way_asked(way)
    if asked != "auto":
        return asked == "each"
    dist = _dist()
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if not local.isdigit() or int(local) != dist.get_world_size():
        return False
    size = dist.get_world_size(pg)
    return _native.group_rule(path, size, 1, 0, False) == "each"


def _each_then_agree(
    pg, path: str, open_file: Callable[[], Any], prepare: Callable[[Any], Any], each: Callable
):
    """A group load whose every rank reads on its own (see :func:`_each_known`): each rank
    opens (``prepare`` checks the file), loads, and then the ranks agree in one small
    collective that all opened the same checkpoint and none failed, else every rank raises
    as :func:`open_group` and :func:`finish` do. Returns ``each()``'s result."""
    group = Group(pg, path)
    global last_way
    last_way = "each"
    own: BaseException | None = None
    digest, out = 0, None
    try:
        file = open_file()
        digest = _native.source_digest(file)
        prepare(file)
        del file
        out = each()
    except Exception as exc:
        own = exc
    _agree(group, path, digest, own, "the closing exchange")
    return out


def _agree(group: Group, path: str, digest: int, own: BaseException | None, what: str) -> int:
    """One small collective: whether any rank failed, and each rank's header digest, host
    and location. Raises on every rank when one failed (its own error there, the same class
    naming it on the others) or when the ranks opened different checkpoints. Returns the
    number of hosts."""
    host = socket.gethostname()
    row = [int(own is not None), _signed(digest), _signed(_hash(host)), _signed(_hash(path))]
    rows = group.gather_ints(row, what)
    if any(r[0] for r in rows) or len({(r[1], r[3]) for r in rows}) > 1:
        # Something is off: the details, as objects (only on this path).
        everyone = group.gather((path, digest, _describe(own)), what)
        _raise_for(group, [h[2] for h in everyone], own)
        lines = "; ".join(f"rank {r}: {h[0]} (digest {h[1]:016x})" for r, h in enumerate(everyone))
        exc = errors.InvalidInputError(
            f"the ranks of the process group were called with different checkpoints: {lines}"
        )
        exc.path = path
        raise exc
    return len({r[2] for r in rows})


def load_new(
    engine,
    pg,
    path: str,
    open_file: Callable[[], Any],
    device,
    verify: bool,
    way: str | None,
    each: Callable[[], dict[str, torch.Tensor]],
    names: list[str] | None = None,
) -> dict[str, torch.Tensor]:
    """The tensors of ``path`` (every one, or ``names`` in their order) on ``device``, on
    every rank of ``pg``: ``each()`` is the single-process load, run by every rank when the
    group reads that way."""
    started = time.perf_counter()
    dev = torch.device(device)

    def chosen(file) -> list[int]:
        entries = file.entries()
        if names is None:
            return list(range(len(entries)))
        at = {e[0]: i for i, e in enumerate(entries)}
        missing = [n for n in names if n not in at]
        if missing:
            exc = errors.NotFoundError(f"{path}: no tensor `{missing[0]}` in the checkpoint")
            exc.path = path
            raise exc
        return [at[n] for n in dict.fromkeys(names)]

    if _each_known(pg, path, way):
        return _each_then_agree(pg, path, open_file, chosen, each)
    opened, indices = open_group(engine, pg, path, open_file, dev, way, chosen)

    nbytes = sum(opened.entries[i][4] for i in indices)
    broadcast = lambda: _broadcast_new(opened, indices, verify, dev)  # noqa: E731
    return run(opened, started, dev, each, broadcast, nbytes)


def read_entries(
    opened: Opened, rows: list, device, verify: bool, alone: Callable[[], dict]
) -> dict[str, torch.Tensor]:
    """The tensors of the entries ``rows`` of a checkpoint open on every rank (a group's
    ``safe_open``), read the group's way: ``alone()`` reads them in this process."""
    started = time.perf_counter()
    at = {e[0]: i for i, e in enumerate(opened.entries)}
    indices = [at[e[0]] for e in rows]
    dev = torch.device(device)

    nbytes = sum(opened.entries[i][4] for i in indices)
    broadcast = lambda: _broadcast_new(opened, indices, verify, dev)  # noqa: E731
    return run(opened, started, dev, alone, broadcast, nbytes)


def load_into(
    engine,
    pg,
    path: str,
    open_file: Callable[[], Any],
    verify: bool,
    way: str | None,
    match: Callable[[Any], tuple[list, list, list[tuple[str, torch.Tensor]]]],
    each: Callable[[], Any],
) -> tuple[list, list]:
    """``load_into`` on every rank of ``pg``: ``match(file)`` checks the target against the
    checkpoint (raising as ``load_state_dict`` does) and gives the missing and unexpected
    names and the ``(name, destination)`` pairs to fill; ``each()`` is the single-process
    load_into. Destinations the group's collectives cannot fill in place (another device,
    dtype or layout) are filled through new tensors and copied."""
    from ._torch_dtypes import TO_NAME

    started = time.perf_counter()
    via = _collective_device(pg, "cpu")
    opened, matched = open_group(engine, pg, path, open_file, via, way, match)
    via = opened.via
    missing, unexpected, pairs = matched
    at = {e[0]: i for i, e in enumerate(opened.entries)}

    def broadcast():
        dests: dict[int, torch.Tensor] = {}
        copies = []
        seen: set[int] = set()
        for name, dst in pairs:
            i = at[name]
            if i in seen:
                continue
            seen.add(i)
            same = (
                TO_NAME.get(dst.dtype) == opened.entries[i][1]
                and dst.is_contiguous()
                and dst.layout == torch.strided
                and dst.device == via
            )
            if same:
                dests[i] = dst.detach()
            else:
                copies.append((dst, i))
        fresh, own = {}, None
        try:
            fresh = new_tensors(opened, [i for _, i in copies], via)
        except Exception as exc:
            own = exc
        _together(opened.group, own, "the allocation")
        dests.update(fresh)
        with torch.no_grad():
            broadcast_into(opened, dests, verify)
            for dst, i in copies:
                dst.copy_(fresh[i])
        return missing, unexpected

    return run(opened, started, via, each, broadcast)
