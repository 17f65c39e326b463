"""Prophesee EVT 2.0 and EVT 3.0 recordings (``.raw``): the header."""

from __future__ import annotations

from pathlib import Path


def header(path: Path) -> list[str]:
    """The ``%`` header lines of a Prophesee ``.raw`` file."""
    lines = []
    with open(path, "rb") as f:
        while f.peek(1)[:1] == b"%":
            lines.append(f.readline().decode("ascii", "replace").strip())
    return lines


def header_geometry(header: list[str]) -> tuple[int, int] | None:
    """``(width, height)`` from an EVT header (``% geometry WxH`` or ``format ...;width=W;
    height=H``), ``None`` when it gives none."""
    for line in header:
        fields = line.lstrip("% ").split()
        if fields[:1] == ["geometry"] and len(fields) == 2 and "x" in fields[1]:
            width, _, height = fields[1].partition("x")
            if width.isdigit() and height.isdigit():
                return int(width), int(height)
        if fields[:1] == ["format"] and len(fields) == 2:
            keys = dict(item.partition("=")[::2] for item in fields[1].split(";"))
            if keys.get("width", "").isdigit() and keys.get("height", "").isdigit():
                return int(keys["width"]), int(keys["height"])
    return None


def header_version(header: list[str]) -> str | None:
    """``'evt2'`` or ``'evt3'``, the format a header names, or ``None`` when it names
    neither."""
    text = " ".join(header).lower()
    for version in ("evt3", "evt2"):
        if f"evt {version[-1]}.0" in text or f"format {version}" in text:
            return version
    return None
