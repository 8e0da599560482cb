"""What one rank and its links achieve (Rates), the defaults per device kind, and how they
travel as JSON (a rates file, the service's database, Ray's key-value store). Pure: no
torch. The cost model (workers/contract/cost_model.py) predicts with them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

INTRA, INTER = "intra", "inter"  # links within one node, and between nodes

# Calibration times collectives among at most this many local processes.
MAX_CALIBRATION_RANKS = 8


@dataclass(frozen=True)
class Rates:
    """What one rank and its links achieve."""

    device: str
    flops_per_s: float  # training FLOP/s one rank sustains (CPU: one core) in the precision
    bandwidth: dict[str, float]  # collective bus bytes/s by link kind (INTRA, INTER)
    latency_s: float  # fixed cost of one collective (on a CPU: at the planned world size)
    memory_bytes_per_s: float  # for the optimizer's elementwise pass
    runtime_bytes: int  # what a rank holds before any model: the process, or CUDA context
    overlap: float  # share of FSDP/DDP collectives hidden behind compute
    cores: float | None = None  # a CPU host's cores, shared by its ranks
    # Bytes a step really keeps per byte of activations this model counts (saved tensors
    # it does not list, the allocator's slack): measured by calibration.
    activation_scale: float = 1.0
    # Bytes FSDP (zero 2/3) keeps resident beyond the model state and its gathered units,
    # per byte of the stage's unsharded parameters. On a CPU a rank's resident set grows
    # over FSDP's first steps well past what DDP's settles at, in step with the parameters
    # (not the activations); measured, not derived (docs/benchmarks.md). On a GPU the
    # allocator's peak is what the gathered units account for: none.
    fsdp_resident_factor: float = 0.0
    # A device's memory, where the kind fixes it (a layout above it does not fit).
    device_memory: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Rates:
        """Rates as `to_json` wrote them; keys this version does not know (a newer one
        wrote them) are left out, and those it lacks (an older one wrote them) are the
        device kind's defaults."""
        known = {f.name for f in fields(cls)}
        given = {k: v for k, v in data.items() if k in known}
        base = DEFAULT_RATES.get(str(given.get("device")))
        return cls(**({**asdict(base), **given} if base is not None else given))


def _gpu(
    device: str, flops: float, intra: float, inter: float, memory_speed: float, memory: int
) -> Rates:
    """A GPU kind's starting rates: NVLink within a node, the network between nodes; a
    collective's fixed cost 20 us, 1 GiB for the CUDA context and workspaces, 70% of the
    data-parallel wrappers' collectives hidden behind compute."""
    return Rates(
        device,
        flops,
        {INTRA: intra, INTER: inter},
        2.0e-5,
        memory_speed,
        1 << 30,
        0.7,
        device_memory=memory,
    )


DEFAULT_RATES: dict[str, Rates] = {
    # The 2-core development machine as `calibrate(spec, 4)` measured it (bench.plan_accuracy
    # in docs/benchmarks.md); calibrate for yours.
    "cpu": Rates(
        "cpu",
        7.2e10,
        {INTRA: 9.0e8, INTER: 5.0e8},
        5.0e-3,
        1.9e10,
        265 << 20,
        0.0,
        2,
        activation_scale=2.5,
        # dp=4 zero 3 on this machine held 7.9x (the plan_accuracy model), 7.4x (dim 384)
        # and 5.3x (seq 256) more than the model without it (docs/benchmarks.md).
        fsdp_resident_factor=6.5,
    ),
    # H200: the compiled 1b preset ran 69,080 tokens/s x 7.04 GFLOP/token, 0.1186 s a
    # step, of which AdamW's pass is about 7 ms: 520 TFLOP/s for the rest.
    "h200": _gpu("h200", 5.2e14, 3.6e11, 4.0e10, 4.3e12, 141 * 10**9),
    "h100": _gpu("h100", 4.6e14, 3.6e11, 4.0e10, 3.0e12, 80 * 10**9),
    "a100": _gpu("a100", 1.5e14, 2.3e11, 2.0e10, 1.6e12, 80 * 10**9),
}
