"""Asynchronous data parallelism: every replica pushes its gradients to parameter-server
shards and pulls the parameters back, without waiting for the others.

The parameters are split by parameter into one shard per data-parallel rank, and each
rank serves its shard from a thread beside its trainer (the servers sit beside the
trainers; no extra processes): fp32 masters, AdamW over them, and a version, the
updates applied. A replica computes one batch's gradient (one data-parallel rank's rows
of one step of the sync layout's batches), clips it by its own norm, and sends each shard
its part with the version it last pulled; the shard applies it at once, or drops or
down-weights it if it is more than `parallel.max_staleness` updates old, and answers with
its newest parameters. The batches are handed out as tickets by rank 0's server: every
(step, rank) batch of the sync layout is trained exactly once, by whichever replica asks
first, so a slow replica trains fewer of them and holds nobody up.

A sync step's worth of gradients is dp updates here, each at 1/dp of the schedule's
learning rate. With dp replicas pushing in turn a gradient is about dp - 1 updates old,
which acts as momentum of about 1 - 1/dp ("asynchrony begets momentum", Mitliagkas et al.
2016), so the shards' AdamW takes beta1 lowered by that much (0.9 - 0.75 = 0.15 on four
replicas). Measured on real text in docs/benchmarks.md: with beta1 0.9 and the whole
learning rate the run ended far above sync's loss.

The replicas meet only at a logged step (every `train.log_every` steps; the spec makes
evaluation and checkpoints fall on them): after a barrier (every replica's last push
answered), every shard's parameters are broadcast so each rank holds the whole newest
model, the loss and counts are summed, and the stop vote is
taken. A checkpoint there saves the model as any layout does, and each shard's AdamW
state as `optim.<name>.<key>` from the rank that serves it, so sync and async checkpoints
restore into each other, on any number of replicas.

Pushes go over their own gloo group (tags keep a replica's requests apart from its
server's replies), staged through host memory on a GPU.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.distributed as dist

from shardline.workers.contract.local_sgd import StalenessPolicy
from shardline.workers.engine.accounting import memory_held
from shardline.workers.engine.checkpoint.state import TensorState
from shardline.workers.engine.dp_strategy import DataParallelStrategy, TrainerView
from shardline.workers.engine.grad_clip import clip_grad_norm
from shardline.workers.engine.metrics import RankReport
from shardline.workers.engine.nonfinite import NonFiniteLoss
from shardline.workers.engine.optimizer import Optimizers, ensure_state, model_name
from shardline.workers.engine.step_outcome import StopVote, agree

log = logging.getLogger(__name__)

# The messages between a replica and a shard's server, apart by tag.
_REQUEST, _GRADIENT, _REPLY, _PARAMS = 1, 2, 3, 4
_PUSH, _STOP, _SKIP = 0, 1, 2  # _SKIP: a batch whose loss was not finite, no gradient
_HOST = torch.device("cpu")


def plan_shards(sizes: list[int], shards: int) -> list[int]:
    """The shard that serves each parameter: largest first onto the least-filled shard,
    so every rank serves about as many values; every rank plans the same."""
    owner = [0] * len(sizes)
    load = [0] * shards
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        k = min(range(shards), key=lambda k: (load[k], k))
        owner[i] = k
        load[k] += sizes[i]
    return owner


@dataclass
class StalenessCounts:
    """What one shard did with the gradients it got since the last meeting."""

    applied: int = 0
    dropped: int = 0
    weighted: int = 0
    staleness_sum: int = 0
    staleness_max: int = 0

    def take(self) -> list[float]:
        values = [float(getattr(self, f.name)) for f in fields(self)]
        for f in fields(self):
            setattr(self, f.name, 0)
        return values


class ParameterShard:
    """The parameters one rank serves: fp32 masters, AdamW over them, and a version: the
    updates applied."""

    def __init__(
        self,
        named: list[tuple[str, torch.Tensor]],
        *,
        lr: Callable[[int], float],
        weight_decay: float,
        max_staleness: int,
        policy: StalenessPolicy,
        beta1: float = 0.9,
    ) -> None:
        self.names = [name for name, _ in named]
        with torch.no_grad():
            self.masters = [p.detach().clone() for _, p in named]
        self.numel = sum(m.numel() for m in self.masters)
        decay = [m for m in self.masters if m.dim() >= 2]  # as Optimizers: norms not decayed
        no_decay = [m for m in self.masters if m.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=0.0,
            betas=(beta1, 0.95),
            eps=1e-8,
        )
        self.lr = lr
        self.max_staleness = max_staleness
        self.policy = policy
        self.version = 0
        self.counts = StalenessCounts()
        self.lock = threading.Lock()  # the server thread and this rank's replica both apply

    @torch.no_grad()
    def apply(self, grad: torch.Tensor, *, pulled: int, step: int) -> None:
        """Apply one replica's gradient of this shard, computed on version `pulled`, with
        the learning rate of `step`."""
        with self.lock:
            staleness = self.version - pulled
            counts = self.counts
            counts.staleness_sum += staleness
            counts.staleness_max = max(counts.staleness_max, staleness)
            if staleness > self.max_staleness:
                if self.policy == StalenessPolicy.drop:
                    counts.dropped += 1
                    return
                grad = grad * ((1 + self.max_staleness) / (1 + staleness))
                counts.weighted += 1
            offset = 0
            for master in self.masters:
                master.grad = grad[offset : offset + master.numel()].view_as(master)
                offset += master.numel()
            for group in self.optimizer.param_groups:
                group["lr"] = self.lr(step)
            self.optimizer.step()
            for master in self.masters:
                master.grad = None
            self.version += 1
            counts.applied += 1

    @torch.no_grad()
    def read(self, out: torch.Tensor) -> int:
        """Copy the newest parameters into `out` (flat, on any device: a GPU shard is sent
        from host memory); returns their version."""
        with self.lock:
            if not self.masters:  # a rank may serve nothing (more replicas than tensors)
                return self.version
            if out.device == self.masters[0].device:
                torch.cat([m.reshape(-1) for m in self.masters], out=out)
            else:
                out.copy_(torch.cat([m.reshape(-1) for m in self.masters]))
            return self.version

    # -- checkpoints -------------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        """AdamW's state of this shard, `<parameter name>.<key>` as `Optimizers` names it:
        its own tensors, so a restore loads into them in place."""
        ensure_state(self.optimizer)
        return {
            f"{name}.{key}": value
            for name, master in zip(self.names, self.masters, strict=True)
            for key, value in self.optimizer.state[master].items()
        }

    @torch.no_grad()
    def load_params(self, params: dict[str, torch.Tensor]) -> None:
        """A restore set the model's parameters: the masters start from them."""
        with self.lock:
            for name, master in zip(self.names, self.masters, strict=True):
                master.copy_(params[name])

    def drop(self) -> None:
        """Free the masters and AdamW's state: the world this shard served has failed."""
        with self.lock:
            self.masters = []
            self.optimizer.state.clear()
            self.optimizer.param_groups.clear()

    def take_counts(self) -> list[float]:
        with self.lock:
            return self.counts.take()

    def tensors(self) -> list[torch.Tensor]:
        """What the shard holds beyond the model (for memory accounting)."""
        state = [v for s in self.optimizer.state.values() for v in s.values()]
        return [*self.masters, *(v for v in state if isinstance(v, torch.Tensor))]


class Tickets:
    """The next batch to train, (step - 1) * dp + slot, handed out by rank 0's server."""

    def __init__(self, first: int) -> None:
        self.next = first
        self.lock = threading.Lock()

    def take(self) -> int:
        with self.lock:
            ticket = self.next
            self.next += 1
            return ticket


class ShardServer:
    """Serves this rank's shard to the other replicas, in a thread, until each has said
    it stopped. A failed world ends it with an error that the trainer's own calls report."""

    def __init__(
        self, shard: ParameterShard, group: dist.ProcessGroup, *, peers: int, tickets: Tickets
    ) -> None:
        self.shard = shard
        self.group = group
        self.peers = peers
        self.tickets = tickets if dist.get_rank() == 0 else None
        self.sent = 0  # bytes of replies, read by the replica at a meeting
        self.error: Exception | None = None
        self.abandoned = False
        self.thread = threading.Thread(target=self._serve, name="shard-server", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        header = torch.zeros(3, dtype=torch.int64)
        grad = torch.empty(self.shard.numel, device=_HOST)
        params = torch.empty(self.shard.numel, device=_HOST)
        device = self.shard.masters[0].device if self.shard.masters else _HOST
        stopped = 0
        try:
            while stopped < self.peers:
                src = dist.recv(header, group=self.group, tag=_REQUEST)
                if self.abandoned:  # its world failed while it waited: serve no more
                    return
                kind, pulled, step = (int(v) for v in header.tolist())
                if kind == _STOP:
                    stopped += 1
                    continue
                if kind == _PUSH:
                    dist.recv(grad, src=src, group=self.group, tag=_GRADIENT)
                    self.shard.apply(grad.to(device), pulled=pulled, step=step)
                version = self.shard.read(params)
                ticket = self.tickets.take() if self.tickets is not None else -1
                reply = torch.tensor([version, ticket], dtype=torch.int64)
                dist.send(reply, dst=src, group=self.group, tag=_REPLY)
                dist.send(params, dst=src, group=self.group, tag=_PARAMS)
                self.sent += params.nbytes + reply.nbytes
        except Exception as err:  # its trainer raises it at its next push or meeting
            self.error = err
            if not self.abandoned:
                log.warning("the parameter server of this rank stopped: %s", err)

    def join(self, timeout_s: float) -> None:
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            log.warning("the parameter server of this rank did not stop in %.0f s", timeout_s)


def _flat_grads(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """One shard's part of this rank's gradients, flat (zeros for a parameter the batch
    did not reach)."""
    if not params:
        return torch.empty(0)
    return torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
    )


def _started(work: dist.Work | None) -> dist.Work:
    assert work is not None  # every rank is in the group
    return work


@dataclass
class RoundOutcome:
    """One replica's part of a round, summed over the world at the meeting."""

    loss_sum: float = 0.0
    norm_sum: float = 0.0
    pushes: int = 0
    sent: int = 0


class AsyncReplica:
    """This rank's replica and the shard it serves; every rank of the world builds one."""

    def __init__(self, trainer: TrainerView, params: list[torch.nn.Parameter]) -> None:
        self.trainer = trainer
        self.params = params  # the trainer's, in the model's order
        spec = trainer.spec
        self.rank, self.replicas = dist.get_rank(), dist.get_world_size()
        module = trainer.parts.modules[0]
        named = [(model_name(n), p) for n, p in module.named_parameters() if p.requires_grad]
        owner = plan_shards([p.numel() for _, p in named], self.replicas)
        self.shard_params = [
            [p for (_, p), k in zip(named, owner, strict=True) if k == shard]
            for shard in range(self.replicas)
        ]
        tr = spec.train
        self.shard = ParameterShard(
            [item for item, k in zip(named, owner, strict=True) if k == self.rank],
            lr=lambda step: trainer.lr_at(step) / self.replicas,
            weight_decay=tr.weight_decay,
            max_staleness=spec.parallel.max_staleness,
            policy=spec.parallel.staleness_policy,
            beta1=max(0.0, 0.9 - (1 - 1 / self.replicas)),
        )
        self.pulled = [
            torch.empty(sum(p.numel() for p in params), device=_HOST)
            for params in self.shard_params
        ]
        self.versions = [0] * self.replicas
        # Every rank, in the same order: one group for the pushes, one (host-side, so no
        # device stream waits on it) for the meetings.
        self.group = dist.new_group(backend="gloo")
        self.meet_group = dist.new_group(backend="gloo")
        self.bad_step: int | None = None  # the first step of a non-finite loss this round
        self.tickets = Tickets(0)
        self.server: ShardServer | None = None
        self.outcome = RoundOutcome()
        log.info(
            "async data parallelism over %d replicas: this rank serves %d of %d parameters "
            "(max staleness %d, then %s)",
            self.replicas,
            self.shard.numel,
            sum(p.numel() for _, p in named),
            spec.parallel.max_staleness,
            spec.parallel.staleness_policy.value,
        )

    def start(self, step: int) -> None:
        """Serve from `step` (a fresh start or a restore): the model is the same on every
        rank, so the shards start from it."""
        self.shard.load_params(
            {
                model_name(n): p.detach()
                for n, p in self.trainer.parts.modules[0].named_parameters()
                if model_name(n) in set(self.shard.names)
            }
        )
        # Each replica's first batch of a round is its own slot; the rest are handed out.
        self.tickets.next = step * self.replicas + self.replicas
        self.server = ShardServer(
            self.shard, self.group, peers=self.replicas - 1, tickets=self.tickets
        )

    # -- one round: from one meeting to the next ----------------------------------------

    def train_round(self, last: int, vote: StopVote) -> dict[str, Any]:
        """Train steps `trainer.step + 1` .. `last` with the others, then meet them (the
        stop vote is taken there)."""
        trainer = self.trainer
        first = trainer.step + 1
        clock = trainer.clock
        clock.arm(True)
        start = time.perf_counter()
        ticket = (first - 1) * self.replicas + self.rank
        while ticket < last * self.replicas:
            ticket = self._train_ticket(ticket)
        metrics = self._meet(first, last)
        # The round's mean loss: every one of its steps x replicas batches was pushed once.
        share = torch.tensor(self.outcome.loss_sum / (last - first + 1), device=trainer.device)
        self.outcome = RoundOutcome()
        metrics["loss"] = agree(share, vote, last, loss_copies=self.replicas)
        metrics["step_time_s"] = (time.perf_counter() - start) / (last - first + 1)
        return metrics

    def _train_ticket(self, ticket: int) -> int:
        """Train one batch and push it; returns the next ticket."""
        trainer = self.trainer
        step, slot = ticket // self.replicas + 1, ticket % self.replicas
        with trainer.clock.part("data"):
            rows = trainer.loader.slot_batch(step, slot).to(trainer.device)
        with trainer.clock.part("compute"):
            loss = trainer.forward_backward(rows)
        trainer.hooks.backward_done(step, trainer.parts.modules)
        norm = clip_grad_norm(
            self.params,
            trainer.spec.train.grad_clip or math.inf,
            stage_ranks=1,
            clock=trainer.clock,
            over_world=False,
        )
        value = float(loss.item())  # pushed now anyway: no overlap is lost
        finite = math.isfinite(value)
        if not finite:  # every rank hears of it at the meeting, and all raise together
            self.bad_step = step if self.bad_step is None else min(self.bad_step, step)
        with trainer.clock.part("comm"):
            ticket = self._push(step, finite)
        if finite:
            self.outcome.loss_sum += value
            self.outcome.norm_sum += norm
        self.outcome.pushes += 1
        trainer.hooks.progress()  # a heartbeat between meetings
        return ticket

    @torch.no_grad()
    def _push(self, step: int, finite: bool = True) -> int:
        """Send each shard its part of this rank's gradients (none where the loss was not
        finite), apply its own, take the newest parameters back; returns the next ticket."""
        if self.server is not None and self.server.error is not None:
            raise RuntimeError(f"this rank's parameter server failed: {self.server.error}")
        flats = [_flat_grads(params) for params in self.shard_params]
        for p in self.params:
            p.grad = None
        keep: list[torch.Tensor] = []  # alive until sent
        works: list[dist.Work] = []
        replies: dict[int, torch.Tensor] = {}
        for k in range(self.replicas):
            if k == self.rank:
                continue
            kind = _PUSH if finite else _SKIP
            header = torch.tensor([kind, self.versions[k], step], dtype=torch.int64)
            keep.append(header)
            works.append(_started(dist.isend(header, dst=k, group=self.group, tag=_REQUEST)))
            self.outcome.sent += header.nbytes
            if finite:
                grad = flats[k].to(_HOST)
                keep.append(grad)
                works.append(_started(dist.isend(grad, dst=k, group=self.group, tag=_GRADIENT)))
                self.outcome.sent += grad.nbytes
            replies[k] = torch.zeros(2, dtype=torch.int64)
            # The replies are posted before any wait: a server never blocks on a replica.
            works += [
                _started(dist.irecv(replies[k], src=k, group=self.group, tag=_REPLY)),
                _started(dist.irecv(self.pulled[k], src=k, group=self.group, tag=_PARAMS)),
            ]
        if finite:
            self.shard.apply(flats[self.rank], pulled=self.versions[self.rank], step=step)
        self.versions[self.rank] = self.shard.read(self.pulled[self.rank])
        ticket = self.tickets.take() if self.rank == 0 else -1
        for work in works:
            work.wait()
        for k, reply in replies.items():
            self.versions[k] = int(reply[0])
            if k == 0:
                ticket = int(reply[1])
        for k in range(self.replicas):
            self._unflatten(k, self.pulled[k])
        return ticket

    def _unflatten(self, shard: int, flat: torch.Tensor) -> None:
        params = self.shard_params[shard]
        if not params:
            return
        flat = flat.to(params[0].device)
        views = flat.split([p.numel() for p in params])
        torch._foreach_copy_(
            list(params), [v.view_as(p) for v, p in zip(views, params, strict=True)]
        )

    # -- the meeting --------------------------------------------------------------------

    @torch.no_grad()
    def _meet(self, first: int, last: int) -> dict[str, Any]:
        """Once every replica has pushed its last batch of the round (a barrier: a shard
        read before that would miss late pushes), every rank takes every shard's newest
        parameters, and the round's norm, bytes, staleness and any non-finite loss are
        summed over the world; all on the host-side group."""
        group = self.meet_group
        with self.trainer.clock.part("comm"):
            dist.barrier(group=group)
            for k in range(self.replicas):
                if k == self.rank:
                    self.shard.read(self.pulled[k])
                dist.broadcast(self.pulled[k], src=k, group=group)
                self._unflatten(k, self.pulled[k])
            versions = torch.tensor([self.shard.version], dtype=torch.int64)
            every = [torch.zeros_like(versions) for _ in range(self.replicas)]
            dist.all_gather(every, versions, group=group)
            self.versions = [int(v) for v in torch.cat(every).tolist()]
            if self.server is not None:  # idle now: every push of the round was answered
                self.outcome.sent += self.server.sent
                self.server.sent = 0
            counts = self.shard.take_counts()
            own = self.outcome
            sums = torch.tensor(
                [own.norm_sum, own.pushes, own.sent, *counts[:-1]], dtype=torch.float64
            )
            dist.all_reduce(sums, group=group)
            bad = self.bad_step if self.bad_step is not None else math.inf
            least = torch.tensor([-counts[-1], bad], dtype=torch.float64)
            dist.all_reduce(least, op=dist.ReduceOp.MIN, group=group)  # max staleness too
            self.bad_step = None
        norm_sum, pushes, sent, applied, dropped, weighted, stale_sum = sums.tolist()
        steps = last - first + 1
        received = applied + dropped
        first_bad = float(least[1])
        return {
            "step": last,
            "grad_norm": norm_sum / max(pushes, 1),
            "pushes": int(pushes),
            "grad_bytes": round(sent / (steps * self.replicas)),
            "staleness_mean": stale_sum / max(received, 1),
            "staleness_max": int(-least[0]),
            "stale_dropped": int(dropped),
            "stale_weighted": int(weighted),
            "nonfinite_step": int(first_bad) if math.isfinite(first_bad) else None,
        }

    def abandon(self) -> None:
        """The world failed: this rank's server serves no more and frees its shard. (Its
        thread may still wait in a receive from the failed world; it ends there, not
        before.)"""
        if self.server is not None:
            self.server.abandoned = True
        self.shard.drop()

    def close(self) -> None:
        """Tell every other rank's server that this replica is done; wait for this rank's
        own server to have heard the same from every other replica."""
        works, keep = [], []
        for k in range(self.replicas):
            if k != self.rank:
                header = torch.tensor([_STOP, 0, 0], dtype=torch.int64)
                keep.append(header)
                works.append(_started(dist.isend(header, dst=k, group=self.group, tag=_REQUEST)))
        for work in works:
            work.wait()
        if self.server is not None:
            self.server.join(60.0)


class AsyncState:
    """A checkpoint's optimizer part under async replicas: the AdamW state of the
    parameters this rank serves, as `optim.<name>.<key>` (the ranks together hold every
    key once, as any layout does)."""

    def __init__(self, shard: ParameterShard, optimizers: Optimizers) -> None:
        self.shard = shard
        self.optimizers = optimizers

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {f"optim.{name}": value for name, value in self.shard.state_dict().items()}

    def load_template(self, manifest: dict[str, Any]) -> dict[str, torch.Tensor]:
        return self.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        # The shard takes the restored parameters when the replica starts serving.
        self.optimizers.after_params_loaded()


class AsyncStrategy(DataParallelStrategy):
    """Replicas that push to parameter-server shards and meet at logged steps."""

    wraps_model = False

    def __init__(self, trainer: TrainerView) -> None:
        super().__init__(trainer)
        self.replica = AsyncReplica(trainer, trainer.params)

    @property
    def meeting_every(self) -> int:
        return self.trainer.spec.train.log_every

    @property
    def steps_per_advance(self) -> int:
        # A save call comes once a round: the snapshot budget is of a round's time.
        return self.trainer.spec.train.log_every

    def optimizer_state(self) -> TensorState:
        return AsyncState(self.replica.shard, self.trainer.optimizers)

    def start(self, step: int) -> None:
        self.replica.start(step)

    def advance(self) -> dict[str, Any]:
        """Train up to the next logged step, where the replicas meet."""
        trainer = self.trainer
        steps_before = trainer.step
        every, total = trainer.spec.train.log_every, trainer.spec.train.steps
        last = 1 if trainer.step == 0 else min(total, (trainer.step // every + 1) * every)
        metrics = self.replica.train_round(last, trainer.vote)
        bad = metrics.pop("nonfinite_step")
        if bad is not None:  # known to every rank at the meeting: all raise
            raise NonFiniteLoss(bad, math.nan, trainer.loader.batch_of(bad))
        trainer.step = last
        steps = last - steps_before
        memory = memory_held(trainer.params, trainer.optimizers, self.replica.shard.tensors())
        # A replica's gradients live from each backward until its push, not at a meeting:
        # count the most it holds.
        memory["grads"] = sum(p.nelement() * p.element_size() for p in trainer.params)
        parts = {part: s / steps for part, s in trainer.clock.seconds().items()}
        trainer.metrics.report = RankReport(memory, parts, metrics["step_time_s"])
        tokens_per_s = trainer.metrics.tokens_per_step / metrics["step_time_s"]
        metrics.update(
            lr=trainer.lr_at(last),
            tokens_per_s=tokens_per_s,
            mfu=trainer.metrics.mfu(tokens_per_s),
        )
        return metrics

    def close(self) -> None:
        self.replica.close()

    def abandon(self) -> None:
        self.replica.abandon()
