"""The GEMM shapes of the models these ops serve, and the shape options of the CLI.

Torch-free. A shape is the routing table's key of a call
(``routing.py``): the router ``{"e": E, "k": K, "out": "float32"|"bfloat16"}`` (``(M, K) @ (E, K)^T``,
sglang asks for float32 logits), fused-A ``{"n": N, "k": K}`` (``(M, K) @ (K, N)``, bf16 out).
``slim-kernel precompile`` and ``slim-kernel info`` take them by ``--model NAME`` (repeatable) or
one by one (``--router E,K[,OUT]``, ``--fused-a N,K``).
"""

from __future__ import annotations

from .jit.catalogue import VEC
from .names import FUSED_A, ROUTER

ROUTER_OUT = ("float32", "bfloat16")

# name -> {op: [shape, ...]}: the router (E experts x hidden K) and MLA's fused q_a/kv_a projection
# (q_lora_rank + kv_lora_rank + rope dim = N, hidden K) of each model.
MODELS: dict[str, dict[str, list[dict]]] = {
    "deepseek-v3": {ROUTER: [{"e": 256, "k": 7168, "out": "float32"}], FUSED_A: [{"n": 2112, "k": 7168}]},
    "kimi-k2": {ROUTER: [{"e": 384, "k": 7168, "out": "float32"}], FUSED_A: [{"n": 2112, "k": 7168}]},
    "kimi-k3": {ROUTER: [{"e": 896, "k": 7168, "out": "float32"}], FUSED_A: [{"n": 3648, "k": 7168}]},
    "glm-5": {ROUTER: [{"e": 256, "k": 6144, "out": "float32"}], FUSED_A: [{"n": 2624, "k": 6144}]},
    "mistral-large-3": {ROUTER: [{"e": 128, "k": 7168, "out": "float32"}], FUSED_A: [{"n": 2112, "k": 7168}]},
}


def _ints(text: str, option: str, want: str) -> list[int]:
    parts = [p.strip() for p in text.split(",")]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"{option} must be {want}, got {text!r}") from None
    if any(v <= 0 for v in values):
        raise ValueError(f"{option} must be {want} with positive integers, got {text!r}")
    return values


def _check_k(k: int, option: str, text: str) -> None:
    if k % VEC:
        raise ValueError(f"{option} {text!r}: K={k} is not a multiple of {VEC}, which the JIT kernels need")


def router_shape(text: str) -> dict:
    """``"E,K"`` or ``"E,K,OUT"`` (OUT float32, the default, or bfloat16) -> a router shape."""
    option, want = "--router", "E,K or E,K,OUT (OUT: float32 or bfloat16)"
    head, sep, out = text.rpartition(",")
    if sep and not out.strip().isdigit():
        out = out.strip().lower()
        if out not in ROUTER_OUT:
            raise ValueError(f"{option} OUT must be one of {', '.join(ROUTER_OUT)}, got {out!r} in {text!r}")
    else:
        head, out = text, "float32"
    values = _ints(head, option, want)
    if len(values) != 2:
        raise ValueError(f"{option} must be {want}, got {text!r}")
    _check_k(values[1], option, text)
    return {"e": values[0], "k": values[1], "out": out}


def fused_a_shape(text: str) -> dict:
    """``"N,K"`` -> a fused-A shape."""
    values = _ints(text, "--fused-a", "N,K")
    if len(values) != 2:
        raise ValueError(f"--fused-a must be N,K, got {text!r}")
    _check_k(values[1], "--fused-a", text)
    return {"n": values[0], "k": values[1]}


def model_shapes(name: str) -> dict[str, list[dict]]:
    key = name.strip().lower()
    if key not in MODELS:
        raise ValueError(f"--model must be one of {', '.join(MODELS)}, got {name!r}")
    return MODELS[key]


def add_shape_arguments(parser) -> None:
    """--model / --router / --fused-a (all repeatable)."""
    parser.add_argument("--model", action="append", default=[], metavar="NAME",
                        help=f"the GEMM shapes of a model: {', '.join(MODELS)} (repeatable)")
    parser.add_argument("--router", action="append", default=[], metavar="E,K[,OUT]",
                        help="a router shape: E experts, hidden size K, OUT float32 (default) or bfloat16")
    parser.add_argument("--fused-a", action="append", default=[], metavar="N,K",
                        help="a fused-A shape: N outputs, hidden size K")


def shapes_from_args(args) -> dict[str, list[dict]] | None:
    """``{op: [shape, ...]}`` from the shape options, None when none was given; ValueError naming
    the option on a malformed or unknown one."""
    if not (args.model or args.router or args.fused_a):
        return None
    picked = [model_shapes(name) for name in args.model]
    picked.append({ROUTER: [router_shape(t) for t in args.router], FUSED_A: [fused_a_shape(t) for t in args.fused_a]})
    return _merge(picked)


def all_model_shapes() -> dict[str, list[dict]]:
    """Every model's shapes, each once."""
    return _merge(MODELS.values())


def _merge(groups) -> dict[str, list[dict]]:
    shapes: dict[str, list[dict]] = {ROUTER: [], FUSED_A: []}
    for group in groups:
        for op, items in group.items():
            shapes[op] += [s for s in items if s not in shapes[op]]
    return shapes
