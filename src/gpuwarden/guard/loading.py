"""Budget-aware model loading: load a model (or a checkpoint's tensors) onto a GPU at the
best precision that fits a memory budget — fp32, then bf16 (fp16 where the GPU has no
bf16), then 8-bit weights — and refuse, with the numbers, when nothing fits.

    loaded = load_within_budget(build_model, budget="6G", example=lambda m: m(x))
    model = loaded.model          # loaded.precision says which one it got

The estimate is the weights at each precision (never above the precision they are
stored in) plus an activation allowance. With ``example`` the allowance is measured:
the example runs after loading, and if the whole footprint (peak, driver's view) is over
the budget, that precision is dropped and the next one tried. Without it the allowance
is a guess (``activation``, default a tenth of the weights) and the result is checked
after loading. A load never ends over budget silently: it either fits or raises.

The budget is either the whole process's (bytes or "6G"; by default the job's budget
under the daemon), where the CUDA context and what the process holds already count, or
a ``Budget`` from MemoryBudgets, where only what the load adds counts. 8-bit weights
use torchao when it is installed, else bitsandbytes; only nn.Linear weights are
quantized. The pure planning (``plan_loads``, ``read_safetensors``) runs without torch."""

from __future__ import annotations

import gc
import json
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuwarden.errors import GpuwardenError, UsageError
from gpuwarden.guard.memory import DriverProbe, MemoryProbe, context_allowance, job_limit
from gpuwarden.units import format_bytes, parse_size

if TYPE_CHECKING:
    from gpuwarden.guard.budgets import Budget

PRECISIONS = ("fp32", "bf16", "fp16", "int8")
BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1}
DEFAULT_ACTIVATION_SHARE = 0.10  # allowance without a measurement, of the weights
# safetensors dtype names -> bytes per element; which are floating point
_ST_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "U16": 2,
    "U32": 4,
    "U64": 8,
}
_ST_FLOAT = {"F64", "F32", "F16", "BF16"}


class DoesNotFit(GpuwardenError):
    """No precision fits the budget."""

    exit_code = 1


class MissingDependency(GpuwardenError):
    """What a request needs is not installed (torch, or an 8-bit backend)."""

    exit_code = 3


@dataclass(frozen=True)
class TensorGroup:
    """Tensors that share a fate: ``float`` ones are cast to the load's precision,
    ``quantizable`` ones (nn.Linear weights) become 8-bit; the rest keep their size."""

    elements: int
    stored_bytes: int  # bytes per element as stored
    float: bool
    quantizable: bool = False
    rows: int = 0  # output channels, for the 8-bit scales


@dataclass(frozen=True)
class Weights:
    groups: tuple[TensorGroup, ...]

    @property
    def parameters(self) -> int:
        return sum(g.elements for g in self.groups)

    @property
    def stored(self) -> int:
        return sum(g.elements * g.stored_bytes for g in self.groups)

    def bytes_at(self, precision: str) -> int:
        """Bytes the tensors take at ``precision`` (never above what they are stored at:
        a bf16 checkpoint is not widened to fp32)."""
        if precision not in BYTES:
            raise UsageError(f"unknown precision {precision!r} (one of {', '.join(PRECISIONS)})")
        total = 0
        for g in self.groups:
            if not g.float:
                total += g.elements * g.stored_bytes
            elif precision == "int8" and g.quantizable:
                total += g.elements + g.rows * 4  # int8 weights, a scale per row
            else:
                half = 2 if precision == "int8" else BYTES[precision]  # int8: the rest in 16 bits
                total += g.elements * min(half, g.stored_bytes)
        return total

    @property
    def quantizable(self) -> bool:
        return any(g.quantizable for g in self.groups)


@dataclass(frozen=True)
class LoadPlan:
    """One precision's estimate against the budget; bytes."""

    precision: str
    weights: int
    activation: int
    available: int  # the budget less what is held already (or the context allowance)

    @property
    def need(self) -> int:
        return self.weights + self.activation

    @property
    def fits(self) -> bool:
        return self.need <= self.available

    def describe(self) -> str:
        return (
            f"{self.precision}: weights {format_bytes(self.weights)} + activations "
            f"{format_bytes(self.activation)} = {format_bytes(self.need)} "
            f"{'fits' if self.fits else 'over'} {format_bytes(self.available)}"
        )


def plan_loads(
    weights: Weights,
    available: int,
    *,
    precisions: Sequence[str] = PRECISIONS,
    activation: int | Callable[[int], int] | None = None,
) -> list[LoadPlan]:
    """An estimate per precision, highest first, dropping precisions that would not make
    the weights any smaller than a higher one does. ``activation``: bytes, a function of
    the weights' bytes, or None for the default share."""
    plans: list[LoadPlan] = []
    for p in precisions:
        if p == "int8" and not weights.quantizable:
            continue
        size = weights.bytes_at(p)
        if plans and size >= plans[-1].weights:
            continue
        if activation is None:
            act = int(size * DEFAULT_ACTIVATION_SHARE)
        elif callable(activation):
            act = activation(size)
        else:
            act = activation
        plans.append(LoadPlan(p, size, act, available))
    return plans


def refusal(plans: Iterable[LoadPlan], budget_text: str) -> str:
    return f"nothing fits {budget_text}: " + "; ".join(p.describe() for p in plans)


def read_safetensors(path: str | Path) -> tuple[Weights, dict[str, tuple[str, tuple[int, ...]]]]:
    """The tensors of a .safetensors file from its header alone (no data read): their
    grouping for the estimate and {name: (dtype, shape)}."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > 100 << 20:
                raise ValueError("header larger than 100 MiB")
            header = json.loads(f.read(length))
    except (OSError, ValueError, struct.error) as exc:
        raise UsageError(f"{path}: not a readable safetensors file ({exc})") from None
    groups: list[TensorGroup] = []
    table: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape = info.get("dtype"), tuple(info.get("shape", ()))
        if dtype not in _ST_BYTES:
            raise UsageError(f"{path}: tensor {name!r} has unknown dtype {dtype!r}")
        elements = 1
        for n in shape:
            elements *= int(n)
        table[name] = (dtype, shape)
        groups.append(TensorGroup(elements, _ST_BYTES[dtype], dtype in _ST_FLOAT))
    return Weights(tuple(groups)), table


# -- torch side ------------------------------------------------------------------------


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise MissingDependency("loading a model needs PyTorch: pip install torch") from None
    return torch


def _module_weights(model: Any) -> Weights:
    torch = _torch()
    quantizable = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    groups = []
    for t in [*model.parameters(), *model.buffers()]:
        groups.append(
            TensorGroup(
                t.numel(),
                t.element_size(),
                t.is_floating_point(),
                quantizable=id(t) in quantizable,
                rows=t.shape[0] if id(t) in quantizable else 0,
            )
        )
    return Weights(tuple(groups))


def _state_dict_weights(tensors: Mapping[str, Any]) -> Weights:
    return Weights(
        tuple(
            TensorGroup(t.numel(), t.element_size(), t.is_floating_point())
            for t in tensors.values()
        )
    )


def _read_checkpoint(path: Path) -> dict[str, Any]:
    """A checkpoint's tensors on the CPU, memory-mapped where the format allows."""
    torch = _torch()
    if not path.exists():
        raise UsageError(f"{path}: no such checkpoint")
    if path.suffix == ".safetensors":
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise MissingDependency(
                "reading .safetensors needs the safetensors package: pip install safetensors"
            ) from None
        return dict(load_file(str(path), device="cpu"))
    loaded = torch.load(str(path), map_location="cpu", mmap=True, weights_only=True)
    if (
        isinstance(loaded, dict)
        and "state_dict" in loaded
        and isinstance(loaded["state_dict"], dict)
    ):
        loaded = loaded["state_dict"]
    if not isinstance(loaded, dict) or not all(torch.is_tensor(v) for v in loaded.values()):
        raise UsageError(f"{path}: not a state dict of tensors")
    return loaded


def _dtype(torch: Any, precision: str) -> Any:
    return {
        "fp32": torch.float32,
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
        "int8": torch.bfloat16,
    }[precision]


QUANTIZERS = ("torchao", "bitsandbytes")


def _installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _quantizer(choice: str | None) -> str:
    """The 8-bit library to use: the one asked for, else torchao, else bitsandbytes."""
    if choice is not None and choice not in QUANTIZERS:
        raise UsageError(f"unknown quantizer {choice!r} (one of {', '.join(QUANTIZERS)})")
    for name in (choice,) if choice else QUANTIZERS:
        if _installed(name):
            return name
    raise MissingDependency(
        f"8-bit weights need {choice or 'torchao or bitsandbytes'}: "
        f"pip install {choice or 'torchao'}"
    )


def _torchao_int8(model: Any, device: Any) -> Any:
    """torchao's int8 weight-only quantization, done on the CPU so that the 16-bit
    weights never reach the GPU; then the model moves."""
    from torchao.quantization import quantize_

    try:
        from torchao.quantization import Int8WeightOnlyConfig

        config: Any = Int8WeightOnlyConfig()
    except ImportError:  # torchao before the config classes
        from torchao.quantization import int8_weight_only

        config = int8_weight_only()
    quantize_(model, config)
    return model.to(device)


def _bitsandbytes_int8(model: Any, device: Any) -> Any:
    """bitsandbytes' LLM.int8() layers; each is quantized as it moves to the GPU, one
    at a time, so the 16-bit model never sits there whole."""
    torch = _torch()
    import bitsandbytes as bnb

    model = model.to(torch.float16)
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear):
                q = bnb.nn.Linear8bitLt(
                    child.in_features,
                    child.out_features,
                    bias=child.bias is not None,
                    has_fp16_weights=False,
                )
                q.weight = bnb.nn.Int8Params(
                    child.weight.data, requires_grad=False, has_fp16_weights=False
                )
                if child.bias is not None:
                    q.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
                setattr(module, name, q.to(device))
    return model.to(device)


@dataclass
class Loaded:
    """What was loaded and what it cost. ``model`` is the module, or {name: tensor} when
    only a checkpoint was given. ``peak``: the footprint measured at its highest (the
    whole process, or what the load added for a Budget)."""

    model: Any
    precision: str
    plans: list[LoadPlan]
    peak: int
    budget: int
    backend: str | None = None  # the 8-bit library used

    def __str__(self) -> str:
        return (
            f"loaded at {self.precision}"
            + (f" ({self.backend})" if self.backend else "")
            + f": peak {format_bytes(self.peak)} of {format_bytes(self.budget)}"
        )


def load_within_budget(
    factory: Callable[[], Any] | None = None,
    *,
    checkpoint: str | Path | None = None,
    budget: int | str | Budget | None = None,
    device: int = 0,
    precisions: Sequence[str] = PRECISIONS,
    activation: int | str | None = None,
    example: Callable[[Any], Any] | None = None,
    quantizer: str | None = None,
    probe: MemoryProbe | None = None,
) -> Loaded:
    """Load ``factory()`` (a module), optionally with ``checkpoint``'s weights, or the
    checkpoint alone as tensors, onto ``cuda:device`` at the best precision in
    ``precisions`` that fits ``budget``. DoesNotFit with every estimate when none does.
    ``example(model)`` measures the activations: it runs under torch.no_grad().
    ``quantizer``: "torchao" or "bitsandbytes" for 8-bit weights (default: the first
    installed)."""
    from gpuwarden.guard.budgets import Budget

    if factory is None and checkpoint is None:
        raise UsageError("give a model factory, a checkpoint, or both")
    for p in precisions:
        if p not in BYTES:
            raise UsageError(f"unknown precision {p!r} (one of {', '.join(PRECISIONS)})")
    if quantizer is not None and quantizer not in QUANTIZERS:
        raise UsageError(f"unknown quantizer {quantizer!r} (one of {', '.join(QUANTIZERS)})")
    torch = _torch()
    if not torch.cuda.is_available():
        raise UsageError("no CUDA GPU is available to load onto")
    torch.cuda.init()
    with torch.cuda.device(device):
        torch.zeros(1, device=f"cuda:{device}")  # bring the context up, to measure it
    probe = probe if probe is not None else DriverProbe()
    shared = isinstance(budget, Budget)

    def footprint() -> int:
        """The process as the driver counts it, or what the load added (a Budget)."""
        if shared:
            return int(torch.cuda.max_memory_reserved(device)) - base_reserved
        reading = probe.read(device)
        peak_reserved = int(torch.cuda.max_memory_reserved(device))
        held = int(torch.cuda.memory_reserved(device))
        if reading.process is not None:
            return reading.process + max(0, peak_reserved - held)
        return peak_reserved + context_allowance()

    if isinstance(budget, Budget):
        limit, text = budget.size, f"budget {budget.name!r} ({format_bytes(budget.size)})"
    elif budget is None:
        daemon = job_limit()
        if daemon is None:
            raise UsageError(
                "no budget: give one (bytes or a size such as 6G), or run "
                "under the gpuwarden daemon, whose job budget is used"
            )
        limit, text = daemon, f"the job budget ({format_bytes(daemon)})"
    else:
        limit = parse_size(budget)
        text = f"{format_bytes(limit)}"
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base_reserved = int(torch.cuda.memory_reserved(device))
    held_now = 0 if shared else footprint()
    available = limit - held_now

    source: dict[str, Any] | None = None
    if checkpoint is not None:
        source = _read_checkpoint(Path(checkpoint))
    if factory is not None:
        try:  # count the parameters without allocating them
            with torch.device("meta"):
                weights = _module_weights(factory())
        except Exception:  # a factory that insists on real tensors: count on the CPU
            weights = _module_weights(factory())
    else:
        assert source is not None
        weights = _state_dict_weights(source)
    allowance = None if activation is None else parse_size(activation)
    if "bf16" in precisions and not torch.cuda.is_bf16_supported(device):
        precisions = [p for p in precisions if p != "bf16"]  # fp16 takes its place
    plans = plan_loads(weights, available, precisions=precisions, activation=allowance)
    if factory is None:
        plans = [p for p in plans if p.precision != "int8"]  # tensors alone: no Linear to quantize
    candidates = [p for p in plans if p.fits]
    if available <= 0:
        raise DoesNotFit(
            f"nothing fits {text}: this process holds {format_bytes(held_now)} "
            "on the GPU already (its CUDA context included)"
        )
    if not candidates:
        raise DoesNotFit(
            refusal(plans, text)
            + (f" (the process holds {format_bytes(held_now)} already)" if held_now else "")
        )
    target = f"cuda:{device}"
    failures: list[str] = []
    for plan in candidates:
        dtype = _dtype(torch, plan.precision)
        backend = None
        try:
            if factory is None:
                assert source is not None
                model: Any = {
                    k: (v.to(target, dtype) if v.is_floating_point() else v.to(target))
                    for k, v in source.items()
                }
            else:
                model = factory()
                if source is not None:
                    model.load_state_dict(source)
                model = model.to(dtype)
                if plan.precision == "int8":
                    backend = _quantizer(quantizer)
                    model = (_torchao_int8 if backend == "torchao" else _bitsandbytes_int8)(
                        model, target
                    )
                else:
                    model = model.to(target)
            torch.cuda.synchronize(device)
            if example is not None:
                with torch.no_grad():
                    example(model)
                torch.cuda.synchronize(device)
            peak = footprint()
        except MissingDependency:
            raise
        except torch.OutOfMemoryError as exc:
            peak, model = -1, None
            failures.append(f"{plan.precision}: CUDA OOM while loading ({exc})".split("\n")[0])
        if model is not None and peak <= limit:
            return Loaded(model, plan.precision, plans, peak, limit, backend)
        if model is not None:
            failures.append(f"{plan.precision}: measured {format_bytes(peak)}")
        model = None
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    raise DoesNotFit(
        f"nothing fits {text}: estimates said "
        + ", ".join(p.precision for p in candidates)
        + " would, but "
        + "; ".join(failures)
    )
