"""The models sglang serves through the JIT GEMMs, and their shapes (torch-free).

One list that ``slim-kernel tune``, ``precompile``, ``info`` and the benchmark read, and their
shape options (``--model NAME``, ``--router E,K[,out]``, ``--fused-a N,K``, all repeatable). A
router shape is ``(E, K, out dtype)`` of ``dsv3_router_gemm`` (``(M, K) @ (E, K)^T``; sglang asks
for float32 logits, other callers bf16), a fused-A shape ``(N, K)`` of ``dsv3_fused_a_gemm`` (MLA's
fused q_a/kv_a projection: q_lora_rank + kv_lora_rank + rope dim = N, hidden size K).
"""

from __future__ import annotations

from dataclasses import dataclass

from .names import FUSED_A, ROUTER

MAX_M = 64  # the decode window the routing tables and the JIT kernels cover; larger M runs the ops' other backends
MEASURED_MS = (*range(1, 17), 17, 20, 24, 28, 32, 40, 48, 56, 64)  # the M a campaign measures (bench_gemm.py)


@dataclass(frozen=True)
class Shape:
    op: str
    n: int  # router: experts E; fused-A: output features N
    k: int
    out: str = "bfloat16"  # output dtype name

    def key(self) -> dict:
        """The routing-table shape dict (ops/<op>.py ``_shape_key``)."""
        if self.op == ROUTER:
            return {"e": self.n, "k": self.k, "out": self.out}
        return {"n": self.n, "k": self.k}

    @classmethod
    def from_key(cls, op: str, key: dict) -> Shape:
        """The shape of a routing-table shape dict (:meth:`key`'s inverse)."""
        if op == ROUTER:
            return cls(op, key["e"], key["k"], key["out"])
        return cls(op, key["n"], key["k"])

    def option(self) -> str:
        """The command-line option naming this shape (``--router E,K,out`` / ``--fused-a N,K``)."""
        if self.op == ROUTER:
            return f"--router {self.n},{self.k},{self.out}"
        return f"--fused-a {self.n},{self.k}"

    def label(self) -> str:
        if self.op == ROUTER:
            return f"router E={self.n} K={self.k} {self.out}"
        return f"fused-A N={self.n} K={self.k}"


def router(e: int, k: int, out: str) -> Shape:
    return Shape(ROUTER, e, k, out)


def fused_a(n: int, k: int) -> Shape:
    return Shape(FUSED_A, n, k)


MODELS: dict[str, tuple[Shape, ...]] = {
    "deepseek-v3": (router(256, 7168, "float32"), router(256, 7168, "bfloat16"), fused_a(2112, 7168)),
    "kimi-k2": (router(384, 7168, "float32"), router(384, 7168, "bfloat16"), fused_a(2112, 7168)),
    "kimi-k3": (router(896, 7168, "float32"), router(896, 7168, "bfloat16"), fused_a(3648, 7168)),
    "glm-5": (router(256, 6144, "float32"), fused_a(2624, 6144)),
    "mistral-large-3": (router(128, 7168, "bfloat16"), router(128, 7168, "float32"), fused_a(2112, 7168)),
}
ALIASES = {"deepseek-r1": "deepseek-v3"}


def model_shapes(name: str) -> tuple[Shape, ...]:
    """The shapes of model ``name`` (case-insensitive); ValueError naming the known models."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in MODELS:
        raise ValueError(f"unknown model {name!r} (known: {', '.join([*MODELS, *ALIASES])})")
    return MODELS[key]


def all_shapes() -> list[Shape]:
    """Every listed model's shapes, each once, in model order."""
    return list(dict.fromkeys(s for shapes in MODELS.values() for s in shapes))


def parse_router(text: str) -> Shape:
    """``"E,K,out"`` (out: float32|fp32|bfloat16|bf16; default float32, what sglang asks for)."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts[:2]):
        raise ValueError(f"--router wants E,K[,out] (e.g. 256,7168,float32), got {text!r}")
    out = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16"}.get(
        parts[2].lower() if len(parts) == 3 else "float32")
    if out is None:
        raise ValueError(f"--router output dtype must be float32 or bfloat16, got {parts[2]!r}")
    return _positive(router(int(parts[0]), int(parts[1]), out), text)


def parse_fused_a(text: str) -> Shape:
    """``"N,K"``."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise ValueError(f"--fused-a wants N,K (e.g. 2112,7168), got {text!r}")
    return _positive(fused_a(int(parts[0]), int(parts[1])), text)


def _positive(shape: Shape, text: str) -> Shape:
    if shape.n < 1 or shape.k < 8 or shape.k % 8:
        raise ValueError(f"bad shape {text!r}: need N/E >= 1 and K a positive multiple of 8")
    return shape


def add_shape_arguments(parser) -> None:
    """--model / --router / --fused-a (all repeatable)."""
    parser.add_argument("--model", action="append", default=[], metavar="NAME",
                        help=f"every shape of a model: {', '.join(MODELS)}; aliases: "
                             f"{', '.join(f'{a} (= {m})' for a, m in ALIASES.items())} (repeatable)")
    parser.add_argument("--router", action="append", default=[], metavar="E,K[,out]",
                        help="a dsv3_router_gemm shape (out: float32, the default, or bfloat16); repeatable")
    parser.add_argument("--fused-a", action="append", default=[], metavar="N,K",
                        help="a dsv3_fused_a_gemm shape; repeatable")


def shapes_from_args(args) -> list[Shape] | None:
    """The shapes the options name, each once, or None when none was given; ValueError naming the
    option on a malformed one or an unknown model."""
    if not (args.model or args.router or args.fused_a):
        return None
    shapes = [s for name in args.model for s in model_shapes(name)]
    shapes += [parse_router(t) for t in args.router] + [parse_fused_a(t) for t in args.fused_a]
    return list(dict.fromkeys(shapes))
