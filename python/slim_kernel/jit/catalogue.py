"""The JIT kernel catalogue: kernel families, their tile configurations, instances and launch shape.

Torch-free (the AOT baseline and precompile read it without torch). Both JIT ops are one skinny
GEMM, ``out(M, N) = act(M, K) @ W(N, K)^T`` (the router: W = the (E, K) router weight, fp32 or
bf16 out; fused-A: W = ``mat_b.T``, bf16 out), served by six kernel families whose sources live
in ``kernels/`` (design notes there):

  skinny  per-thread cp.async ring, swap-AB mma.sync, split-K over warps and a cluster (both ops)
  narrow  a CTA per few rows over the whole K, CUDA-core FMAs, no cluster (both ops, M <= 16)
  ring    loader warps filling an mbarrier ring with cp.async, compute warps on mma.sync, split-K
          over a cluster (router, M <= 32)
  direct  ring's split-K cluster and mma.sync, each lane loading its fragments straight into
          registers (router, M <= 16)
  stream  weight and token loader warps filling an mbarrier ring, four compute warps each owning a
          quarter of K, a CTA per 16 rows (fused-A, M <= 32)
  sliced  narrow's CTA per 8 rows over the whole K on mma.sync, the MMA's 8 columns holding the
          rows (router, M <= 16)

A family config is a frozen dataclass with ``instance(op, m, out_dtype, shape=None)`` (``shape`` =
the call's (N, K); None = the tuned shape), ``geometry(n, k, sm_count)`` and ``smem(m, shape=None)``
(mirrors of the ``*_smem_bytes`` formulas in the ``.cuh`` files; the kernels trap when launched with less). Tile rules
(``jit/rules.py``) map M ranges to configs; the measured routing table (``slim_kernel/routing.py``) names a
configuration from :data:`VARIANTS` per shape and M.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import models
from ..names import FUSED_A, ROUTER
from .arch import limits
from .spec import KernelInstance

MAX_M = models.MAX_M  # the JIT window: skinny takes up to 8 token tiles of 8
VEC = 8  # bf16 elements per 16-byte load: K and row strides must be multiples of this
MAX_CLUSTER = 8  # portable cluster size: the most split=0 picks
MAX_SPLIT = 16  # explicit split may use non-portable clusters (kMaxSplit in kernels/reduce.cuh)
# the configurations are sized for sm_90 (arch.LIMITS); a launch checks the device's own limits
MAX_SMEM = limits("sm_90").smem_per_block
SMEM_PER_SM = limits("sm_90").smem_per_sm
SMEM_RESERVED_PER_CTA = limits("sm_90").smem_reserved_per_cta
OUT_DTYPES = {ROUTER: ("float32", "bfloat16"), FUSED_A: ("bfloat16",)}
SOURCES = {ROUTER: ("dsv3_router_gemm.cuh", "dsv3_router_gemm_kernel"),
           FUSED_A: ("dsv3_fused_a_gemm.cuh", "dsv3_fused_a_gemm_kernel")}
# Launch-argument signature: act, w, out, M, N, K, ld_act, ld_w, ld_out
POINTER_SIGNATURE = "pppiiiiii"


def token_tiles(m: int) -> int:
    """8-token MMA tiles an M needs (1, 2, 4 or 8: one instance per bucket)."""
    return 1 if m <= 8 else 2 if m <= 16 else 4 if m <= 32 else 8


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check(ok: bool, cfg, what: str) -> None:
    if not ok:
        raise ValueError(f"bad JIT GEMM config {cfg}: {what}")


@dataclass(frozen=True)
class Skinny:
    kernel, family = "skinny", 0  # the family and its SK_FAMILY id (kernels/dsv3_*_gemm.cuh)
    ops = (ROUTER, FUSED_A)
    rt: int = 1  # 16-row weight tiles per CTA (compile-time)
    stages: int = 8  # per-warp cp.async ring depth in 32-k blocks (compile-time)
    warps: int = 4  # warps per CTA (launch-time)
    split: int = 0  # CTAs per cluster splitting K; 0 = as many as fill the SMs (launch-time)

    def __post_init__(self):
        _check(1 <= self.rt <= 8 and 2 <= self.stages <= 16 and 1 <= self.warps <= 10
               and 0 <= self.split <= MAX_SPLIT, self, f"need rt 1..8, stages 2..16, warps 1..10, split 0..{MAX_SPLIT}")

    def max_m(self, shape: tuple[int, int] | None = None) -> int:
        return MAX_M

    def stages_for(self, m: int) -> int:
        """``stages``, or fewer where the ring of M's token tiles would not fit in shared memory."""
        return _stages_that_fit(self.stages, 0, self.warps * (2 * self.rt + token_tiles(m)) * 512)

    def instance(self, op: str, m: int, out_dtype: str, shape: tuple[int, int] | None = None) -> KernelInstance:
        return _make(op, out_dtype, SK_FAMILY=self.family, SK_NT=token_tiles(m), SK_RT=self.rt, SK_STAGES=self.stages_for(m))

    def geometry(self, n: int, k: int, sm_count: int) -> tuple[tuple, tuple, tuple | None]:
        groups = _cdiv(n, 16 * self.rt)
        split = self.split or min(MAX_CLUSTER, max(1, sm_count // groups))
        split = max(1, min(split, _cdiv(k, 32) // self.warps or 1))
        return (groups, split, 1), (32 * self.warps, 1, 1), ((1, split, 1) if split > 1 else None)

    def smem(self, m: int, shape: tuple[int, int] | None = None) -> int:  # skinny_smem_bytes in kernels/skinny_gemm.cuh
        nt = token_tiles(m)
        return max(self.stages_for(m) * self.warps * (2 * self.rt + nt) * 512, _partials(self.rt, nt, self.warps))


@dataclass(frozen=True)
class Narrow:
    kernel, family = "narrow", 1  # the family and its SK_FAMILY id (kernels/dsv3_*_gemm.cuh)
    ops = (ROUTER, FUSED_A)
    rows: int = 2  # output rows per CTA (compile-time)
    cpt: int = 2  # 16-byte chunks per thread per row and round (compile-time)
    threads: int = 448  # block size (compile-time: K = 7168 is one round of 448 x 2 chunks)
    tokens: int = 16  # the largest M served (1..16): one instance per M
    plain: int = 0  # 1: L1-allocating loads instead of L1::no_allocate (compile-time; narrow_gemm.cuh)
    late: int = 0  # 1: the PDL trigger after the FMAs instead of at entry (compile-time)
    regs: int = 0  # a register cap (compile-time; 0: none; with exactk, of the straight-line instances only)
    exactk: int = 0  # K of the straight-line instances at `threads` (exact_for; compile-time; 0: none)
    generic_tokens: int = 0  # the largest M of the generic body (other shapes), where it spills past it (0: tokens)

    def __post_init__(self):
        _check(1 <= self.rows <= 8 and 1 <= self.cpt <= 4 and self.threads % 32 == 0 and 32 <= self.threads <= 1024
               and 1 <= self.tokens <= 16 and self.plain in (0, 1) and self.late in (0, 1)
               and (self.regs == 0 or 24 <= self.regs <= 255)
               and self.exactk >= 0 and self.exactk % VEC == 0
               and 0 <= self.generic_tokens <= self.tokens and (self.exactk or not self.generic_tokens), self,
               "need rows 1..8, cpt 1..4, threads a multiple of 32 in 32..1024, tokens 1..16, plain and late 0 "
               f"or 1, regs 0 or 24..255, exactk 0 or a positive multiple of {VEC}, generic_tokens 0..tokens "
               "(with exactk)")

    def max_m(self, shape: tuple[int, int] | None = None) -> int:
        """The largest M served at the call's (N, K) (None: the tuned shape)."""
        if self.generic_tokens and not self.exact_for(shape):
            return self.generic_tokens
        return self.tokens

    def fitted_threads(self, k: int) -> int:
        """The block of the straight-line body at K, or 0 where K has none. A configuration whose one round covers
        ``exactk`` (``exactk == 8 cpt threads``) has one at every smaller K that one round of K / (8 cpt) threads
        covers (a multiple of 32 threads): the same body, every lane loaded, compiled for that K (K-fitted, as
        sglang's tiny_gemm is compiled per K); others at ``exactk`` alone."""
        if not self.exactk:
            return 0
        if k == self.exactk:
            return self.threads
        per_warp = VEC * self.cpt * 32
        one_round = self.exactk == VEC * self.cpt * self.threads
        return k // (VEC * self.cpt) if one_round and 0 < k < self.exactk and k % per_warp == 0 else 0

    def exact_for(self, shape: tuple[int, int] | None) -> bool:
        """Whether a call at (N, K) gets a straight-line instance (``shape`` None: the tuned shape, K = exactk):
        K fitted (:meth:`fitted_threads`) and N a multiple of rows (every instance is compiled for its exact M
        anyway). Its registers are the exact body's alone (a generic body beside it would set them: 84 against 72
        at M=5), so it is its own instance."""
        return bool(self.exactk) and (
            shape is None or (shape[0] % self.rows == 0 and self.fitted_threads(shape[1]) > 0))

    def block(self, shape: tuple[int, int] | None = None) -> int:
        """Threads per CTA at the call's (N, K): the fitted block of its straight-line instance, else ``threads``."""
        return self.fitted_threads(shape[1]) if shape is not None and self.exact_for(shape) else self.threads

    def registers(self, m: int, shape: tuple[int, int] | None = None) -> int:
        """Registers per thread at M, roughly (what decides how many CTAs share an SM): 8 + 10 rows cpt + 4 cpt M
        (each row's chunks and each token's fragments held at once), in the units of 8 that the SM allocates; never
        under nvcc 13.0's sm_90a counts of the straight-line bodies at M 1-16 (rows 1-8, cpt 1-4), mostly within 25%
        at M <= 8, up to 1.9x past it (tokens then load in batches of four); then the block bound (one CTA of
        ``block`` threads per SM) and the cap."""
        bound = min(255, 65536 // self.block(shape) // 8 * 8)
        cap = self.regs if self.regs and (self.exact_for(shape) or not self.exactk) else bound
        return min(-(-(8 + 10 * self.rows * self.cpt + 4 * self.cpt * m) // 8) * 8, bound, cap)

    def lane_fill(self, k: int) -> float:
        """The share of the rounds' thread-chunks that hold data at K (idle lanes still take their turn); 1 where K
        has a straight-line body (fitted: one full round)."""
        chunks, per_round = k // VEC, (self.fitted_threads(k) or self.threads) * self.cpt
        return chunks / (_cdiv(chunks, per_round) * per_round)

    def instance(self, op: str, m: int, out_dtype: str, shape: tuple[int, int] | None = None) -> KernelInstance:
        if m > self.max_m(shape):
            raise ValueError(f"this narrow kernel serves M <= {self.max_m(shape)} at this shape, got M={m}")
        exact = self.exact_for(shape)
        # The cap is for the straight-line body (where it was measured); under it the generic body
        # spills from M=4 on, so other shapes get the generic body uncapped.
        regs = self.regs if exact or not self.exactk else 0
        # the options only when set, so instances without them keep their keys (and cached cubins)
        options = {k: v for k, v in (("SK_PLAIN", self.plain), ("SK_LATE", self.late), ("SK_MAXNREG", regs)) if v}
        if exact:
            options["SK_EXACTK"] = self.exactk if shape is None else shape[1]
        return _make(op, out_dtype, SK_FAMILY=self.family, SK_ROWS=self.rows, SK_MT=m, SK_CPT=self.cpt,
                     SK_THREADS=self.block(shape), **options)

    def geometry(self, n: int, k: int, sm_count: int) -> tuple[tuple, tuple, tuple | None]:
        return (_cdiv(n, self.rows), 1, 1), (self.block((n, k)), 1, 1), None

    def smem(self, m: int, shape: tuple[int, int] | None = None) -> int:  # narrow_smem_bytes in kernels/narrow_gemm.cuh
        return self.rows * m * self.block(shape) * 4


@dataclass(frozen=True)
class Ring:
    kernel, family = "ring", 2  # the family and its SK_FAMILY id (kernels/dsv3_*_gemm.cuh)
    ops = (ROUTER,)  # fused-A lost to skinny and sglang's kernel at every M (benchmark/DESIGN.md)
    tk: int = 128  # k per ring stage (compile-time)
    stages: int = 8  # ring depth (compile-time; fewer where M's stages would not fit)
    warps: int = 4  # compute warps (compile-time), plus `loaders` weight-loader warps and one activation warp
    loaders: int = 1
    split: int = 8  # CTAs per cluster splitting K (launch-time)

    def __post_init__(self):
        _check(self.tk % 32 == 0 and 32 <= self.tk <= 512 and 2 <= self.stages <= 32 and 1 <= self.warps <= 8
               and (self.tk // 32) % self.warps == 0 and self.loaders in (1, 2, 4) and (self.tk // 2) % (
                   32 * self.loaders) == 0 and 1 <= self.split <= MAX_SPLIT, self,
               f"need tk a multiple of 32 in 32..512, stages 2..32, warps 1..8 dividing tk/32, loaders 1/2/4 "
               f"dividing tk/64, split 1..{MAX_SPLIT}")

    def max_m(self, shape: tuple[int, int] | None = None) -> int:
        return 32  # past it (4 token tiles) the router's ring lost to skinny and cuBLAS by 1.5x

    def _stage(self, m: int) -> int:  # ring_stage_bytes in kernels/ring_gemm.cuh
        return (2 + token_tiles(m)) * self.tk * 16

    def _fixed(self, stages: int, m: int) -> int:  # ring_barrier_bytes + partials_bytes(1, nt, warps)
        return _cdiv(stages * 16, 128) * 128 + _partials(1, token_tiles(m), self.warps)

    def stages_for(self, m: int) -> int:
        return _stages_that_fit(self.stages, self._fixed(self.stages, m), self._stage(m))

    def instance(self, op: str, m: int, out_dtype: str, shape: tuple[int, int] | None = None) -> KernelInstance:
        return _make(op, out_dtype, SK_FAMILY=self.family, SK_NT=token_tiles(m), SK_TK=self.tk, SK_STAGES=self.stages_for(m),
                     SK_CW=self.warps, SK_LW=self.loaders)

    def geometry(self, n: int, k: int, sm_count: int) -> tuple[tuple, tuple, tuple | None]:
        return _split_k_tiles(n, _cdiv(k, self.tk), self.split, 32 * (self.warps + self.loaders + 1))

    def smem(self, m: int, shape: tuple[int, int] | None = None) -> int:  # ring_smem_bytes in kernels/ring_gemm.cuh
        stages = self.stages_for(m)
        return self._fixed(stages, m) + stages * self._stage(m)


@dataclass(frozen=True)
class Stream:
    kernel, family = "stream", 3  # the family and its SK_FAMILY id (kernels/dsv3_*_gemm.cuh)
    ops = (FUSED_A,)  # a CTA per 16 rows and no split-K: the router's 256-384 rows would fill 16-24 SMs
    stages: int = 8  # ring depth (compile-time; fewer where M's stages would not fit)
    pieces: int = 1  # contiguous 512-byte pieces of every row in a stage (compile-time)
    rt: int = 1  # 16-row weight tiles per CTA (compile-time)

    def __post_init__(self):
        _check(2 <= self.stages <= 64 and self.pieces in (1, 2) and self.rt in (1, 2), self,
               "need stages 2..64, pieces 1 or 2 and rt 1 or 2")

    def max_m(self, shape: tuple[int, int] | None = None) -> int:
        return 32  # 4 token tiles (stream_gemm.cuh: NT <= 4)

    def _stage(self, m: int) -> int:  # stream_stage_bytes in kernels/stream_gemm.cuh
        return (16 * self.rt + 8 * token_tiles(m)) * 512 * self.pieces

    def _fixed(self, m: int) -> int:  # kStreamBarrierBytes + partials_bytes(rt, nt, 4)
        return 1024 + _partials(self.rt, token_tiles(m), 4)

    def stages_for(self, m: int) -> int:
        return _stages_that_fit(self.stages, self._fixed(m), self._stage(m))

    def instance(self, op: str, m: int, out_dtype: str, shape: tuple[int, int] | None = None) -> KernelInstance:
        rt = {"SK_RT": self.rt} if self.rt != 1 else {}  # only when set: the others keep their keys
        return _make(op, out_dtype, SK_FAMILY=self.family, SK_NT=token_tiles(m), SK_STAGES=self.stages_for(m),
                     SK_PIECES=self.pieces, **rt)

    def geometry(self, n: int, k: int, sm_count: int) -> tuple[tuple, tuple, tuple | None]:
        return (_cdiv(n, 16 * self.rt), 1, 1), (256, 1, 1), None

    def smem(self, m: int, shape: tuple[int, int] | None = None) -> int:  # stream_smem_bytes in kernels/stream_gemm.cuh
        return self._fixed(m) + self.stages_for(m) * self._stage(m)


@dataclass(frozen=True)
class Direct:
    kernel, family = "direct", 4  # the family and its SK_FAMILY id (kernels/dsv3_*_gemm.cuh)
    ops = (ROUTER,)
    warps: int = 4  # warps per CTA (compile-time)
    bpw: int = 7  # 32-k blocks per warp and round (compile-time): K = 7168 over 8 ranks of 4 warps is one round
    split: int = 8  # CTAs per cluster splitting K (launch-time)

    def __post_init__(self):
        _check(1 <= self.warps <= 8 and 1 <= self.bpw <= 16 and 1 <= self.split <= MAX_SPLIT, self,
               f"need warps 1..8, bpw 1..16, split 1..{MAX_SPLIT}")

    def max_m(self, shape: tuple[int, int] | None = None) -> int:
        return 16  # two token tiles: a round's fragments live in registers

    def instance(self, op: str, m: int, out_dtype: str, shape: tuple[int, int] | None = None) -> KernelInstance:
        if m > self.max_m():
            raise ValueError(f"this direct kernel serves M <= {self.max_m()}, got M={m}")
        return _make(op, out_dtype, SK_FAMILY=self.family, SK_NT=token_tiles(m), SK_CW=self.warps, SK_BPW=self.bpw)

    def geometry(self, n: int, k: int, sm_count: int) -> tuple[tuple, tuple, tuple | None]:
        return _split_k_tiles(n, _cdiv(k, 32), self.split, 32 * self.warps)

    def smem(self, m: int, shape: tuple[int, int] | None = None) -> int:  # direct_smem_bytes in kernels/direct_gemm.cuh
        return _partials(1, token_tiles(m), self.warps)


@dataclass(frozen=True)
class Sliced:
    kernel, family = "sliced", 5  # the family and its SK_FAMILY id (kernels/dsv3_*_gemm.cuh)
    ops = (ROUTER,)  # fused-A lost to stream and flashinfer at every M (benchmark/DESIGN.md)
    rows = 8  # weight rows per CTA: the MMA's 8 columns (kSlicedRows in kernels/sliced_gemm.cuh)
    warps: int = 16  # warps per CTA (compile-time)
    bpw: int = 14  # 32-k blocks per warp and round (compile-time): K = 7168 is one round where warps x bpw x 32 >= K
    exactk: int = 7168  # K of the instances with constant addresses (exact_for; compile-time; 0: none)

    def __post_init__(self):
        _check(1 <= self.warps <= 32 and 1 <= self.bpw <= 16 and self.exactk >= 0 and self.exactk % VEC == 0, self,
               f"need warps 1..32, bpw 1..16, exactk 0 or a multiple of {VEC}")

    def exact_for(self, shape: tuple[int, int] | None) -> bool:
        """Whether a call at (N, K) gets the instance compiled for its K (``shape`` None: the tuned shape)."""
        return bool(self.exactk) and (shape is None or (shape[1] == self.exactk and shape[0] % self.rows == 0))

    def max_m(self, shape: tuple[int, int] | None = None) -> int:
        return 16  # the MMA's 16 rows are the tokens

    def instance(self, op: str, m: int, out_dtype: str, shape: tuple[int, int] | None = None) -> KernelInstance:
        if m > self.max_m():
            raise ValueError(f"this sliced kernel serves M <= {self.max_m()}, got M={m}")
        exact = {"SK_EXACTK": self.exactk} if self.exact_for(shape) else {}
        return _make(op, out_dtype, SK_FAMILY=self.family, SK_NT=token_tiles(m), SK_CW=self.warps, SK_BPW=self.bpw,
                     **exact)

    def geometry(self, n: int, k: int, sm_count: int) -> tuple[tuple, tuple, tuple | None]:
        return (_cdiv(n, self.rows), 1, 1), (32 * self.warps, 1, 1), None

    def registers(self, m: int, shape: tuple[int, int] | None = None) -> int:
        """Registers per thread: the block bound (one CTA per SM; warps allocated in fours), which ptxas fills
        (`sliced_r8a16`: 106 at K=7168, 118-128 in the generic body under nvcc 13.0, hoisting the token batches)."""
        return min(255, 65536 // (128 * _cdiv(self.warps, 4)) // 8 * 8)

    def smem(self, m: int, shape: tuple[int, int] | None = None) -> int:  # sliced_smem_bytes in kernels/sliced_gemm.cuh
        return self.warps * 8 * token_tiles(m) * self.rows * 4


GemmConfig = Skinny | Narrow | Ring | Direct | Stream | Sliced
FAMILIES: dict[str, type] = {cls.kernel: cls for cls in (Skinny, Narrow, Ring, Direct, Stream, Sliced)}


def _stages_that_fit(wanted: int, fixed: int, per_stage: int) -> int:
    """``wanted`` ring stages, or as many as fit in shared memory beside ``fixed`` bytes (at least 2)."""
    return max(2, min(wanted, (MAX_SMEM - fixed) // per_stage))


def _split_k_tiles(n: int, k_units: int, split: int, threads: int) -> tuple[tuple, tuple, tuple | None]:
    """ring / direct: a CTA per 16 rows, K's ``k_units`` shared by a cluster of up to ``split`` CTAs."""
    split = max(1, min(split, k_units))
    return (_cdiv(n, 16), split, 1), (threads, 1, 1), ((1, split, 1) if split > 1 else None)


def _partials(rt: int, nt: int, warps: int) -> int:  # partials_bytes in kernels/reduce.cuh
    return (warps + 1) * rt * nt * 128 * 4


def _make(op: str, out_dtype: str, signature: str = POINTER_SIGNATURE, **defines) -> KernelInstance:
    if out_dtype not in OUT_DTYPES[op]:
        raise ValueError(f"{op} has no {out_dtype} output (only {', '.join(OUT_DTYPES[op])})")
    source, entry = SOURCES[op]
    if op == ROUTER:
        defines["SK_OUT_BF16"] = int(out_dtype == "bfloat16")
    return KernelInstance.make(source, entry, signature, **defines)


# The configurations the benchmark measures and the routing table may name, each with what it is for (the
# evidence: benchmark/DESIGN.md); "skinny" serves every M of both ops. A name is the family, then tokens
# for the settings that tell it apart, each letter with one meaning in every family: r<N> weight rows per
# CTA, t<N> threads, n<N> rounds over K (default 1), k<N> the fitted K in units of 1024 (default 7), c<N> a
# register cap, s<N> CTAs per cluster splitting K, a<N> warps, w<N> ring stages, p<N> pieces per row and
# stage; g L1-allocating loads, l the PDL trigger after the FMAs. Older names (ALIASES) still find their
# configuration wherever a name is read (tables, tools).
_VARIANTS: dict[str, dict[str, GemmConfig]] = {
    ROUTER: {
        "skinny": Skinny(rt=1, stages=8, warps=4, split=0),  # any shape and M: the fallback
        "skinny_s4": Skinny(rt=1, stages=8, warps=4, split=4),  # E 256-896 from M 6 to 64: a 4-CTA split
        # narrow: a CTA per few experts over the whole K, a straight-line body at its fitted K (other shapes: the
        # generic body); the 72-register cap fits a CTA beside the RMSNorm CTA before it (896 threads x 32 registers)
        "narrow_r1c72": Narrow(rows=1, cpt=2, threads=448, tokens=10, regs=72, exactk=7168),  # one expert a CTA, M 1-10
        "narrow_r1c72g": Narrow(rows=1, cpt=2, threads=448, tokens=10, plain=1, regs=72, exactk=7168),  # the same, L1 loads
        "narrow_r2c72": Narrow(rows=2, cpt=2, threads=448, tokens=7, regs=72, exactk=7168),  # E 768-896, M 1-5
        "narrow_r2c72l": Narrow(rows=2, cpt=2, threads=448, tokens=6, late=1, regs=72, exactk=7168),  # never the fastest yet
        "narrow_r3c72l": Narrow(rows=3, cpt=2, threads=448, tokens=4, late=1, regs=72, exactk=7168),  # E=768, M 2-4
        "narrow_r3t896": Narrow(rows=3, cpt=1, threads=896, tokens=9, generic_tokens=6, exactk=7168),  # E=384, M 1-9, one wave
        "narrow_r7t896": Narrow(rows=7, cpt=1, threads=896, tokens=4, generic_tokens=1, exactk=7168),  # E=896, M=4, one wave
        "narrow_r2t896": Narrow(rows=2, cpt=1, threads=896, tokens=10, exactk=7168),  # E 128-256, M 1-10
        "narrow_r4t896": Narrow(rows=4, cpt=1, threads=896, tokens=16, generic_tokens=4, exactk=7168),  # E 256-512, M 1-13
        "narrow_r1t896": Narrow(rows=1, cpt=1, threads=896, tokens=16, exactk=7168),  # E 32-384, one expert a CTA, M 2-16
        "narrow_r2t768k6": Narrow(rows=2, cpt=1, threads=768, tokens=16, exactk=6144),  # K <= 6144, E 128-512, M 1-16
        "narrow_r7n2": Narrow(rows=7, cpt=1, threads=448, tokens=5, exactk=7168),  # E=896, M 2-5, one wave in two K rounds
        "narrow_r2t384k6": Narrow(rows=2, cpt=2, threads=384, tokens=10, exactk=6144),  # K=6144 (GLM-5), M 1-10
        "narrow_r2t384k6c104": Narrow(rows=2, cpt=2, threads=384, tokens=12, regs=104, exactk=6144),  # K=6144, M 9-12 under a 104-register cap
        "narrow_r2t384k6c128": Narrow(rows=2, cpt=2, threads=384, tokens=16, regs=128, exactk=6144),  # K=6144 M 12-16 (plain producer; H100 and H200)
        "narrow_r2c104": Narrow(rows=2, cpt=2, threads=448, tokens=12, regs=104, exactk=7168),  # E=256 M=11 (plain producer; H100 and H200)
        "narrow_r2c128": Narrow(rows=2, cpt=2, threads=448, tokens=16, regs=128, exactk=7168),  # E=256 M 12-13 (plain producer; H100 and H200)
        "narrow_r3c128": Narrow(rows=3, cpt=2, threads=448, tokens=10, regs=128, exactk=7168),  # E=384 M=9 on the H100 (M=11 spills under NVRTC)
        "narrow_r1t224": Narrow(rows=1, cpt=4, threads=224, tokens=16, exactk=7168),  # E=128, M 11-12, K in one round
        "narrow_r1t224c128": Narrow(rows=1, cpt=4, threads=224, tokens=16, regs=128, exactk=7168),  # E=128 M 11-15 (H100 and H200; uncapped: 149-163 registers)
        "ring_s8": Ring(tk=128, stages=8, warps=4, loaders=1, split=8),  # M 13-32: loader warps and an 8-CTA split
        "direct_s8": Direct(warps=4, bpw=7, split=8),  # M 7-16: fragments straight into registers, 8-CTA split
        "direct_s4": Direct(warps=8, bpw=7, split=4),  # the same with a 4-CTA split (E 256-384, M 11-15)
        "direct_s16": Direct(warps=2, bpw=7, split=16),  # the same with a 16-CTA split (M 10-16)
        # sliced: narrow's CTA per 8 rows over the whole K on mma.sync, E 384-896 from M 3;
        # K=7168 in one round of 14, 8 or 7 weight loads a lane (more warps: fewer loads queued per lane)
        "sliced_r8a16": Sliced(warps=16, bpw=14),  # E 384-896, M 4-16 (H100; on the H200 at 14 points)
        "sliced_r8a28": Sliced(warps=28, bpw=8),  # E=896 M 3-9, E=384 M 6-8 (H200)
        "sliced_r8a32": Sliced(warps=32, bpw=7),  # E 384-896, M 7-16 (H200)
    },
    FUSED_A: {
        "skinny": Skinny(rt=1, stages=8, warps=8, split=1),  # any shape and M: the fallback
        "skinny_a10w6": Skinny(rt=1, stages=6, warps=10, split=1),  # never the fastest yet
        # stream: loader warps, an mbarrier ring, a CTA per 16 rows; the PDL trigger at the ring's last fill
        "stream_w8p1": Stream(stages=8, pieces=1),  # M 24-32: 2 KB pieces, 8 stages
        "stream_w6p1": Stream(stages=6, pieces=1),  # M 24-32: the same in 6 stages
        "stream_w4p2": Stream(stages=4, pieces=2),  # N up to about 1800, M 1-16: 1 KB pieces
        "stream_w3p2": Stream(stages=3, pieces=2),  # N past 132 x 16 rows, M 1-16: two CTAs per SM, one wave
        "stream_r32w4p2": Stream(stages=4, pieces=2, rt=2),  # N 2624-3648, M 1-32: 32 rows a CTA, one wave
        "stream_r32w8p1": Stream(stages=8, pieces=1, rt=2),  # the same in 8 stages (N=2624, M 17-30)
        # narrow: a CTA per 1-8 rows over the whole K, spreading thin weights over SMs stream's 16-row CTAs leave idle
        "narrow_r1t896": Narrow(rows=1, cpt=1, threads=896, tokens=16, exactk=7168),  # N 576-704, M 5-7
        "narrow_r2t896": Narrow(rows=2, cpt=1, threads=896, tokens=10, exactk=7168),  # M 1-6
        "narrow_r4t896": Narrow(rows=4, cpt=1, threads=896, tokens=16, generic_tokens=4, exactk=7168),  # M 1-4
        "narrow_r8t896": Narrow(rows=8, cpt=1, threads=896, tokens=4, generic_tokens=1, exactk=7168),  # never the fastest yet
    },
}
ALIASES: dict[str, dict[str, str]] = {
    ROUTER: {"skinny_c4": "skinny_s4", "narrow_r1kc": "narrow_r1c72", "narrow_r1gkc": "narrow_r1c72g", "narrow_r2kc": "narrow_r2c72", "narrow_r2klc": "narrow_r2c72l", "narrow_r3klc": "narrow_r3c72l", "narrow_r7": "narrow_r7n2", "narrow_r2k6": "narrow_r2t384k6", "narrow_r2k6c": "narrow_r2t384k6c104", "ring_c8": "ring_s8", "direct_c8": "direct_s8", "direct_c4": "direct_s4", "direct_c16": "direct_s16"},
    FUSED_A: {"skinny_w10": "skinny_a10w6", "stream_c": "stream_w8p1", "stream_c6": "stream_w6p1", "stream_w4": "stream_w4p2", "stream_w3": "stream_w3p2", "stream_r2": "stream_r32w4p2", "stream_r2c": "stream_r32w8p1"},
}


class Named(dict):
    """An op's configurations by name; an alias (:data:`ALIASES`) finds its configuration too, and
    iteration gives the current names only."""

    def __init__(self, items: dict, aliases: dict[str, str]):
        super().__init__(items)
        self.aliases = aliases

    def canonical(self, name):
        return self.aliases.get(name, name)

    def __getitem__(self, name):
        return super().__getitem__(self.canonical(name))

    def get(self, name, default=None):
        return super().get(self.canonical(name), default)

    def __contains__(self, name) -> bool:
        return super().__contains__(self.canonical(name))


VARIANTS: dict[str, Named] = {op: Named(named, ALIASES[op]) for op, named in _VARIANTS.items()}
FALLBACK_VARIANT = "skinny"  # serves every M of both ops: the choice where nothing was measured


def variant_serves(cfg: GemmConfig, op: str, m: int, shape: tuple[int, int] | None = None) -> bool:
    """Whether ``cfg`` can launch for ``op`` at ``m`` and the call's (N, K) (None: the tuned shape)
    within the device's shared memory."""
    return op in cfg.ops and m <= cfg.max_m(shape) and cfg.smem(m, shape) <= MAX_SMEM


def first_alike(op: str, m: int, out_dtype: str, shape: tuple[int, int], sm_count: int) -> dict[str, str]:
    """``{variant: the first variant, in catalogue order, that launches the same kernel}`` for the variants serving
    ``op`` at ``m`` and the call's (N, K): same instance, grid, block, cluster and shared memory (itself where none
    before it does). Configurations fitted alike (``narrow_r2t896`` at K <= 6144 is ``narrow_r2t768k6``) are one
    kernel: tune times it once."""
    first: dict[tuple, str] = {}
    out: dict[str, str] = {}
    for name, cfg in VARIANTS[op].items():
        if variant_serves(cfg, op, m, shape):
            launch = (cfg.instance(op, m, out_dtype, shape), cfg.geometry(*shape, sm_count), cfg.smem(m, shape))
            out[name] = first.setdefault(launch, name)
    return out


ANY_SHAPE = (0, 0)  # an (N, K) no straight-line instance serves (Narrow.exact_for): the generic body


def instances(op: str, cfg: GemmConfig, max_m: int = MAX_M, lo: int = 1) -> list[KernelInstance]:
    """The instances ``cfg`` compiles to for M in lo..max_m: one per token bucket (narrow: per M) and
    out dtype, and for narrow configurations with ``exactk`` both the straight-line one and the generic one."""
    seen: list[KernelInstance] = []
    for m in range(lo, min(max_m, cfg.max_m()) + 1):
        if cfg.smem(m) > MAX_SMEM:
            continue
        for dt in OUT_DTYPES[op]:
            for shape in (None, ANY_SHAPE):
                if m > cfg.max_m(shape):
                    continue
                inst = cfg.instance(op, m, dt, shape)
                if inst not in seen:
                    seen.append(inst)
    return seen


def all_instances(ops: tuple[str, ...] = (ROUTER, FUSED_A)) -> list[tuple[str, KernelInstance]]:
    """``(op, instance)`` for every instance of every variant: what precompile and the AOT baseline build."""
    out: list[tuple[str, KernelInstance]] = []
    for op in ops:
        for cfg in VARIANTS[op].values():
            out += [(op, inst) for inst in instances(op, cfg) if (op, inst) not in out]
    return out
