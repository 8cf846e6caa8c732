"""Backend implementations. Each module is imported only when one of its specs is first used.

Every implementation takes the op's implementation arguments, output first, and writes
the result into ``output``: ``fn(output, *inputs) -> None``.
"""
