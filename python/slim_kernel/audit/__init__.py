"""Wheel audit and size tooling: prove a wheel carries no retired AOT code, and measure it.

Everything here is torch-free and reads wheels as zip member streams (no extraction):
``wheel`` (safe archive access), ``elf``/``fatbin``/``device`` (binary readers), ``rules``
(which op names are retired), ``scan`` (per-member scanning), ``runner`` (parallel scan of a
wheel), ``findings`` (attribution and the audit report), ``size`` (size model and report).
"""
