"""Tile rules: the ``SLIM_KERNEL_JIT_CONFIG_<OP>`` syntax mapping M ranges to family configurations.

``"8:kernel=narrow,rows=3;64:rt=1,stages=8"`` serves M <= 8 with a narrow configuration and M 9-64 with
a skinny one (``kernel`` defaults to skinny); every other key is a field of the family's config
(:mod:`slim_kernel.jit.catalogue`).
"""

from __future__ import annotations

from dataclasses import fields

from .catalogue import FAMILIES, MAX_M, GemmConfig


def parse_config(text: str) -> GemmConfig:
    """``"kernel=narrow,rows=3"`` (``kernel`` defaults to skinny) -> a family config."""
    items = {}
    for item in filter(None, (f.strip() for f in text.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"bad JIT config item {item!r} in {text!r} (want key=value)")
        items[key.strip()] = value.strip()
    family = FAMILIES.get(items.pop("kernel", "skinny"))
    if family is None:
        raise ValueError(f"bad JIT config {text!r}: kernel must be one of {', '.join(FAMILIES)}")
    names = [f.name for f in fields(family)]
    for key, value in items.items():
        if key not in names:
            raise ValueError(f"bad JIT config item {key!r} in {text!r} (keys of kernel={family.kernel}: "
                             f"{', '.join(names)})")
        if not value.lstrip("-").isdigit():
            raise ValueError(f"bad JIT config item {key}={value!r} in {text!r} (want an integer)")
    return family(**{k: int(v) for k, v in items.items()})


Rules = tuple[tuple[int, GemmConfig], ...]


def parse_rules(text: str, op: str) -> Rules:
    """``"8:kernel=narrow;64:rt=1,stages=8"`` -> ((max_m, config), ...), sorted, covering M up to MAX_M."""
    rules = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        max_m, sep, body = part.partition(":")
        if not sep:
            max_m, body = str(MAX_M), part
        if not max_m.strip().isdigit():
            raise ValueError(f"bad JIT rule {part!r} in {text!r}: want MAXM:config")
        cfg = parse_config(body)
        if op not in cfg.ops:
            raise ValueError(f"JIT config {body!r}: kernel={cfg.kernel} does not serve {op}")
        rules.append((int(max_m), cfg))
    rules.sort(key=lambda r: r[0])
    if not rules or rules[-1][0] < MAX_M:
        raise ValueError(f"JIT rules {text!r} must cover M up to {MAX_M}")
    lo = 1
    for max_m, cfg in rules:
        if max_m >= lo and max_m > cfg.max_m():
            raise ValueError(f"JIT rules {text!r}: kernel={cfg.kernel} serves M <= {cfg.max_m()}, not M={lo}..{max_m}")
        lo = max(lo, max_m + 1)
    return tuple(rules)


def rule_for(rules: Rules, m: int) -> GemmConfig:
    return next(cfg for max_m, cfg in rules if m <= max_m)
