"""Routing tables for the CPU tests: a device, entries and table files in the shipped schema (v2) or in v1."""

from __future__ import annotations

from slim_kernel import routing
from slim_kernel.names import ROUTER

H200 = routing.Device("NVIDIA H200", 132, "sm_90")
V074 = (("flashinfer", "0.7.4"),)  # the installed versions the tests route for


def entry(m=1, pdl=False, us=None, shape=None, op=ROUTER, **extra) -> dict:
    return {"op": op, "shape": shape or {"e": 144, "k": 5120, "out": "float32"}, "m": m, "pdl": pdl,
            "us": us or {"jit:direct_c8": 3.0, "torch": 7.0}, **extra}


def header(device=H200, flashinfer="0.7.4") -> dict:
    """What ``tune.write_table`` takes: the device and the versions measured with."""
    return {"arch": device.arch, "device": device.name, "sms": device.sms, "versions": {"flashinfer": flashinfer},
            "generated_by": "test"}


def table_file(entries, device=H200, flashinfer="0.7.4") -> dict:
    """A v2 table file of one measurement group."""
    group = {k: v for k, v in header(device, flashinfer).items() if k != "generated_by"}
    return {"schema": routing.SCHEMA, "generated_by": "test", "measurements": [{**group, "entries": list(entries)}]}


def v1_file(entries, device=H200, flashinfer="0.7.4") -> dict:
    """The same in schema 1 (what users' caches hold from before): one ``flashinfer`` column per entry."""
    return {"schema": 1, "arch": device.arch, "device": device.name, "sms": device.sms, "flashinfer": flashinfer,
            "generated_by": "test", "entries": [{**e, "flashinfer": flashinfer} for e in entries]}


def table(*entries) -> routing.Table:
    """A shipped-style table of ``entries`` (the estimate's training points), of no particular device."""
    return routing.parse(table_file(entries, routing.Device("", None, "sm_90")), "test")[0]
