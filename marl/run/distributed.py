"""Distributed training context for ``torchrun`` (gloo on CPU, nccl on CUDA).

This module is the only place the trainers touch ``torch.distributed`` directly (the whitening
library reduces its own statistics when called with ``distributed=True``). Launch with::

    torchrun --standalone --nproc_per_node=2 -m marl.train --algo grpo ...

and every rank calls :func:`init_distributed` first. Without torchrun's environment variables
the same code runs as one process: every helper below is then a no-op (or the identity).

Contract (docs/CONTRACTS.md, section 5)::

    ctx = init_distributed(timeout_s=120.0)        # DistContext(enabled, rank, world_size, ...)
    ctx.seed_offset(base_seed)                     # distinct seeds per rank
    broadcast_parameters(module, ctx)              # rank 0's parameters/buffers to all ranks
    average_gradients(parameters, ctx)             # exact all-reduce mean of .grad
    all_reduce_sum(tensor, ctx)                    # in place
    all_gather_objects(obj, ctx) -> list           # small python objects (metrics)
    shutdown(ctx)

Failure handling: the process group is created with ``timeout=timeout_s``; gloo collectives
honour it, so if a rank dies or hangs the others raise instead of waiting forever. Collectives
issued through this module (and any code inside ``with guard(ctx, "what"):``) re-raise such
failures as :class:`DistributedError`, whose message names the rank that failed, the
operation, the timeout and, when it can be determined, the peer rank that went missing
(ranks publish a heartbeat and an exit marker in the rendezvous store for that purpose).
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import math
import os
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "RANK_SEED_STRIDE",
    "DistContext",
    "DistributedError",
    "all_gather_objects",
    "all_reduce_sum",
    "average_gradients",
    "barrier",
    "broadcast_object",
    "broadcast_parameters",
    "guard",
    "init_distributed",
    "shutdown",
]

RANK_SEED_STRIDE = 1_000_000
"""Rank r's seeds start at ``base_seed + r * RANK_SEED_STRIDE`` (``DistContext.seed_offset``)."""

_HEARTBEAT_INTERVAL_S = 1.0
_KEY_PREFIX = "marl_distributed"


class DistributedError(RuntimeError):
    """A collective failed: a peer rank died, hung past the timeout, or the group is broken."""


@dataclass(frozen=True)
class DistContext:
    """Where this process sits in the (possibly trivial) process group.

    Attributes:
        enabled: True when a torch.distributed process group was initialised (torchrun).
        rank: global rank in ``[0, world_size)``; 0 when not enabled.
        world_size: number of processes; 1 when not enabled.
        local_rank: rank on this machine (selects the CUDA device with nccl).
        device: the device this rank computes on.
        backend: ``"gloo"``, ``"nccl"`` or None when not enabled.
        timeout_s: the process-group timeout in seconds (bound on a hang).
    """

    enabled: bool = False
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str | None = None
    timeout_s: float = 120.0

    @property
    def is_main(self) -> bool:
        """True on rank 0, the only rank that writes logs, checkpoints and evaluation."""
        return self.rank == 0

    def seed_offset(self, base_seed: int) -> int:
        """Seed for this rank: ``base_seed + rank * RANK_SEED_STRIDE``.

        Rank 0 keeps ``base_seed`` (a 1-process run and rank 0 of a multi-process run start
        alike). Ranks draw from disjoint ranges as long as each rank uses fewer than
        ``RANK_SEED_STRIDE`` consecutive seeds from its offset.
        """
        if isinstance(base_seed, bool) or not isinstance(base_seed, int):
            raise TypeError(f"base_seed must be an int, got {type(base_seed).__name__}")
        if base_seed < 0:
            raise ValueError(f"base_seed must be >= 0, got {base_seed}")
        return base_seed + self.rank * RANK_SEED_STRIDE


# ----------------------------------------------------------------------------- setup


def _env_int(name: str) -> int:
    raw = os.environ[name]
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from None


def _resolve_device(device: str | torch.device | None, local_rank: int) -> torch.device:
    if device is None or str(device) == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank)
        return torch.device("cpu")
    dev = torch.device(device)
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' requested but CUDA is not available; use 'cpu'")
        if dev.index is None:
            dev = torch.device("cuda", local_rank)
    return dev


def init_distributed(
    timeout_s: float = 120.0, *, device: str | torch.device | None = None
) -> DistContext:
    """Initialise the default process group from torchrun's environment, if present.

    Args:
        timeout_s: process-group timeout in seconds: a collective waiting longer than this for
            a peer raises (so a dead or hung rank cannot stall the others forever).
        device: ``None``/"auto" (CUDA device ``LOCAL_RANK`` when CUDA is available, else CPU),
            "cpu" or "cuda". The backend follows: nccl for CUDA, gloo for CPU.

    Returns:
        The context. Without ``RANK``/``WORLD_SIZE`` in the environment (plain ``python``) a
        single-process context with ``enabled=False``; nothing is initialised.
    """
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
        raise TypeError(f"timeout_s must be a number of seconds, got {type(timeout_s).__name__}")
    if not math.isfinite(timeout_s) or timeout_s <= 0:
        raise ValueError(f"timeout_s must be a positive finite number of seconds, got {timeout_s}")
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return DistContext(
            enabled=False, device=_resolve_device(device, 0), timeout_s=float(timeout_s)
        )

    rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")
    local_rank = _env_int("LOCAL_RANK") if "LOCAL_RANK" in os.environ else rank
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"invalid torchrun environment: RANK={rank}, WORLD_SIZE={world_size}")
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if name not in os.environ:
            raise ValueError(
                f"RANK/WORLD_SIZE are set but {name} is not; launch with torchrun "
                "(e.g. torchrun --standalone --nproc_per_node=2 -m marl.train ...)"
            )
    dev = _resolve_device(device, local_rank)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if dist.is_initialized():
        if dist.get_rank() != rank or dist.get_world_size() != world_size:
            raise ValueError(
                "a process group is already initialised with a different rank/world size "
                f"({dist.get_rank()}/{dist.get_world_size()} vs {rank}/{world_size})"
            )
        backend = str(dist.get_backend())
    else:
        dist.init_process_group(
            backend=backend,
            timeout=datetime.timedelta(seconds=float(timeout_s)),
            rank=rank,
            world_size=world_size,
        )
    ctx = DistContext(
        enabled=True,
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        device=dev,
        backend=backend,
        timeout_s=float(timeout_s),
    )
    _start_liveness(ctx)
    return ctx


def shutdown(ctx: DistContext) -> None:
    """Mark this rank as finished and destroy the process group (no-op when not enabled)."""
    if not ctx.enabled:
        return
    _stop_liveness("shutdown")
    if dist.is_initialized():
        dist.destroy_process_group()


# ------------------------------------------------------------- liveness diagnostics


class _Liveness:
    """Heartbeat thread + exit marker in the rendezvous store, read when a collective fails."""

    def __init__(self, ctx: DistContext) -> None:
        self.ctx = ctx
        self.stop_event = threading.Event()
        self.store = _default_store()
        self.thread: threading.Thread | None = None
        self.exited = False
        self.ops_entered = 0

    def start(self) -> None:
        if self.store is None:
            return
        self._beat()
        self.thread = threading.Thread(
            target=self._run, name=f"marl-heartbeat-{self.ctx.rank}", daemon=True
        )
        self.thread.start()
        atexit.register(self.mark_exit, "process exited")

    def _beat(self) -> None:
        with contextlib.suppress(Exception):
            self.store.set(f"{_KEY_PREFIX}/heartbeat/{self.ctx.rank}", repr(time.time()))

    def _run(self) -> None:
        while not self.stop_event.wait(_HEARTBEAT_INTERVAL_S):
            self._beat()

    def mark_exit(self, how: str) -> None:
        if self.exited or self.store is None:
            return
        self.exited = True
        self.stop_event.set()
        # Join the heartbeat before the store or the interpreter goes away: a daemon thread
        # caught inside a store call (GIL released) when Python finalises is killed as it
        # takes the GIL back, and that forced unwind through C++ aborts the process
        # ("terminate called without an active exception").
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout=_HEARTBEAT_INTERVAL_S + 5.0)
        with contextlib.suppress(Exception):
            self.store.set(f"{_KEY_PREFIX}/exit/{self.ctx.rank}", how)

    def enter_op(self) -> None:
        self.ops_entered += 1
        if self.store is not None:
            with contextlib.suppress(Exception):
                self.store.add(f"{_KEY_PREFIX}/ops/{self.ctx.rank}", 1)

    def missing_peers(self) -> list[str]:
        """Human-readable notes on peers that exited or stopped beating (best effort)."""
        if self.store is None:
            return []
        notes: list[str] = []
        now = time.time()
        for peer in range(self.ctx.world_size):
            if peer == self.ctx.rank:
                continue
            try:
                if self.store.check([f"{_KEY_PREFIX}/exit/{peer}"]):
                    how = self.store.get(f"{_KEY_PREFIX}/exit/{peer}").decode()
                    notes.append(f"rank {peer} left the group early ({how})")
                    continue
                beat = float(self.store.get(f"{_KEY_PREFIX}/heartbeat/{peer}").decode())
            except Exception:
                continue
            silent = now - beat
            if silent > 3 * _HEARTBEAT_INTERVAL_S:
                notes.append(
                    f"rank {peer} has sent no heartbeat for {silent:.1f} s (killed or crashed)"
                )
                continue
            with contextlib.suppress(Exception):
                peer_ops = self.store.add(f"{_KEY_PREFIX}/ops/{peer}", 0)
                if peer_ops < self.ops_entered:
                    notes.append(
                        f"rank {peer} is alive but behind: it entered {peer_ops} guarded "
                        f"collectives, this rank {self.ops_entered} (hung or diverged)"
                    )
        return notes


_LIVENESS: _Liveness | None = None


def _default_store() -> dist.Store | None:
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except Exception:
        return None


def _start_liveness(ctx: DistContext) -> None:
    global _LIVENESS
    if _LIVENESS is not None:
        return
    _LIVENESS = _Liveness(ctx)
    _LIVENESS.start()


def _stop_liveness(how: str) -> None:
    global _LIVENESS
    if _LIVENESS is not None:
        _LIVENESS.mark_exit(how)
        _LIVENESS = None


_COMM_ERROR_MARKERS = (
    "gloo",
    "nccl",
    "connection",
    "timed out",
    "timeout",
    "closed by peer",
    "socket",
    "pair closure",
    "store",
)


def _is_comm_failure(err: BaseException) -> bool:
    """True for errors raised by a failed collective (not for ordinary bugs in the block)."""
    dist_error = getattr(dist, "DistError", None)
    if dist_error is not None and isinstance(err, dist_error):
        return True
    text = str(err).lower()
    return any(marker in text for marker in _COMM_ERROR_MARKERS)


@contextlib.contextmanager
def guard(ctx: DistContext, what: str) -> Iterator[None]:
    """Re-raise a failed collective inside the block as a clear :class:`DistributedError`.

    Use around code that talks to the other ranks indirectly (e.g. ``whiten(...,
    distributed=True)``). The error names this rank, the operation, the timeout, and which
    peer rank went missing when that can be determined.
    """
    if ctx.enabled and _LIVENESS is not None:
        _LIVENESS.enter_op()
    try:
        yield
    except DistributedError:
        raise
    except RuntimeError as err:
        if not ctx.enabled or not _is_comm_failure(err):
            raise
        peers = _LIVENESS.missing_peers() if _LIVENESS is not None else []
        diagnosis = "; ".join(peers) if peers else "a peer rank died, hung or diverged"
        raise DistributedError(
            f"distributed {what} failed on rank {ctx.rank} of {ctx.world_size} "
            f"(process-group timeout {ctx.timeout_s:g} s): {diagnosis}. "
            f"Check the other ranks' logs. Backend error: {err}"
        ) from err


# ----------------------------------------------------------------------- collectives


def all_reduce_sum(tensor: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """Sum ``tensor`` over all ranks, in place; returns it (unchanged when not enabled)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    if ctx.enabled:
        with guard(ctx, "all_reduce_sum"):
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_gather_objects(obj: object, ctx: DistContext) -> list:
    """Gather one picklable object from every rank: a list indexed by rank (``[obj]`` alone)."""
    if not ctx.enabled:
        return [obj]
    out: list = [None] * ctx.world_size
    with guard(ctx, "all_gather_objects"):
        dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: object, ctx: DistContext, src: int = 0) -> object:
    """Rank ``src``'s picklable object on every rank (``obj`` itself when not enabled)."""
    if not ctx.enabled:
        return obj
    box = [obj]
    with guard(ctx, "broadcast_object"):
        dist.broadcast_object_list(box, src=src)
    return box[0]


def barrier(ctx: DistContext) -> None:
    """Wait for every rank (bounded by the process-group timeout)."""
    if ctx.enabled:
        with guard(ctx, "barrier"):
            dist.barrier()


def _by_dtype(tensors: Iterable[torch.Tensor]) -> dict[torch.dtype, list[torch.Tensor]]:
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault(t.dtype, []).append(t)
    return groups


def broadcast_parameters(module: nn.Module, ctx: DistContext, src: int = 0) -> None:
    """Copy rank ``src``'s parameters and buffers into ``module`` on every rank (in place).

    Call after building (or resuming) the model and before the first update, so that all
    ranks start identical. One flattened broadcast per dtype.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if not ctx.enabled:
        return
    tensors = [t for t in list(module.parameters()) + list(module.buffers()) if t.numel() > 0]
    with guard(ctx, "broadcast_parameters"), torch.no_grad():
        for group in _by_dtype(tensors).values():
            flat = torch.cat([t.detach().reshape(-1) for t in group])
            dist.broadcast(flat, src=src)
            offset = 0
            for t in group:
                n = t.numel()
                t.copy_(flat[offset : offset + n].view_as(t))
                offset += n


def average_gradients(
    parameters: Iterable[torch.Tensor] | nn.Module,
    ctx: DistContext,
    *,
    weight: float | None = None,
) -> None:
    """All-reduce mean of ``.grad`` over ranks, in place (call before clipping and ``step``).

    Exactly what DistributedDataParallel computes: with equal per-rank batch sizes and a
    mean-reduced loss, the result equals the gradient of the loss on the concatenation of all
    ranks' batches. With unequal batches pass ``weight`` = this rank's number of samples (the
    mean is then weighted, ``sum_r w_r g_r / sum_r w_r``, which is again exactly the gradient
    of the mean loss over the concatenated batch). Parameters that require grad but have
    ``grad is None`` on this rank contribute zeros (and receive the average), so all ranks
    take the same step. One flattened all-reduce per dtype.
    """
    params = list(parameters.parameters() if isinstance(parameters, nn.Module) else parameters)
    params = [p for p in params if p.requires_grad]
    if weight is not None:
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise TypeError(f"weight must be a number, got {type(weight).__name__}")
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"weight must be a finite number >= 0, got {weight}")
    if not ctx.enabled or not params:
        return
    for p in params:
        if p.grad is not None and p.grad.is_sparse:
            raise TypeError("average_gradients does not support sparse gradients")
    w = 1.0 if weight is None else float(weight)
    with guard(ctx, "average_gradients"), torch.no_grad():
        for dtype, group in _by_dtype(params).items():
            pieces = [
                (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in group
            ]
            weight_entry = torch.tensor([w], dtype=dtype, device=group[0].device)
            flat = torch.cat([torch.cat(pieces) * w, weight_entry])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            total_weight = float(flat[-1])
            if total_weight <= 0:
                raise ValueError("average_gradients: the weights of all ranks sum to 0")
            flat = flat[:-1] / total_weight
            offset = 0
            for p in group:
                n = p.numel()
                g = flat[offset : offset + n].view_as(p)
                if p.grad is None:
                    p.grad = g.clone()
                else:
                    p.grad.copy_(g)
                offset += n
