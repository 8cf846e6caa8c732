"""Wheel audit and size tooling: prove a wheel carries no retired AOT code, and measure it.

Everything here is torch-free and reads wheels as zip member streams (no extraction):
``limits`` (bounds and errors), ``wheel`` (safe archive access), ``stream`` (forward-only
reads, retained spans), ``elf``/``fatbin``/``device`` (binary readers), ``demangle``, ``rules``
(which op names are retired), ``scan`` (per-member scanning), ``nested`` (archives inside a
wheel), ``runner`` (parallel scan of a wheel, progress), ``findings`` (attribution and the audit
report), ``cli`` (`slim-kernel audit`), ``size``/``size_report``/``size_cli`` (`slim-kernel size`).
"""
