"""File tools confined to a session's work directory.

Every path is resolved (symlinks included) and must stay inside the work directory: ``..`` that
climbs out, an absolute path elsewhere, and a symlink that points outside are refused before any
file is touched.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, Field

from agent.tools.base import Tool, ToolContext, ToolOutput


class PathDenied(PermissionError):
    """A path that leaves the work directory."""


def confine(workdir: Path | None, raw: str) -> Path:
    """Resolve ``raw`` inside ``workdir`` or raise :class:`PathDenied` saying why."""
    if workdir is None:
        raise PathDenied("this session has no work directory")
    root = workdir.resolve()
    if "\x00" in raw:
        raise PathDenied("path contains a NUL byte")
    candidate = Path(raw)
    target = candidate if candidate.is_absolute() else root / candidate
    resolved = target.resolve(strict=False)
    if resolved != root and not resolved.is_relative_to(root):
        raise PathDenied(f"path {raw!r} is outside the work directory")
    return resolved


class ReadFileArgs(BaseModel):
    """Arguments of ``read_file``."""

    path: str = Field(description="File path relative to the work directory")
    max_bytes: int = Field(default=200_000, ge=1, le=10_000_000)


class ReadFile(Tool[ReadFileArgs]):
    """Read a text file."""

    name = "read_file"
    description = "Read a UTF-8 text file from the work directory."
    Args = ReadFileArgs
    repeat_safe = True

    async def run(self, args: ReadFileArgs, ctx: ToolContext) -> ToolOutput:
        try:
            path = confine(ctx.workdir, args.path)
            with path.open("rb") as fh:
                data = fh.read(args.max_bytes + 1)
        except (PathDenied, OSError) as exc:
            return ToolOutput(f"read_file refused: {exc}", True)
        text = data[: args.max_bytes].decode("utf-8", errors="replace")
        if len(data) > args.max_bytes:
            text += f"\n[... file longer than {args.max_bytes} bytes; rest not shown ...]"
        return ToolOutput(text)


class WriteFileArgs(BaseModel):
    """Arguments of ``write_file``."""

    path: str = Field(description="File path relative to the work directory")
    content: str = Field(description="The whole new content")


class WriteFile(Tool[WriteFileArgs]):
    """Create or replace a text file."""

    name = "write_file"
    description = "Create or overwrite a UTF-8 text file in the work directory (parents are created)."
    Args = WriteFileArgs
    repeat_safe = True

    async def run(self, args: WriteFileArgs, ctx: ToolContext) -> ToolOutput:
        try:
            path = confine(ctx.workdir, args.path)
            path.parent.mkdir(parents=True, exist_ok=True)
            path = confine(ctx.workdir, args.path)  # parents may have been links
            tmp = path.with_name(f".{path.name}.goald-tmp")
            tmp.write_text(args.content, encoding="utf-8")
            os.replace(tmp, path)
        except (PathDenied, OSError) as exc:
            return ToolOutput(f"write_file refused: {exc}", True)
        return ToolOutput(f"wrote {len(args.content.encode())} bytes to {args.path}")


class EditFileArgs(BaseModel):
    """Arguments of ``edit_file``."""

    path: str
    old: str = Field(description="Exact text to replace; must occur exactly once")
    new: str


class EditFile(Tool[EditFileArgs]):
    """Replace one exact occurrence of a text in a file."""

    name = "edit_file"
    description = "Replace exactly one occurrence of `old` with `new` in a text file of the work directory."
    Args = EditFileArgs

    async def run(self, args: EditFileArgs, ctx: ToolContext) -> ToolOutput:
        try:
            path = confine(ctx.workdir, args.path)
            text = path.read_text(encoding="utf-8")
        except (PathDenied, OSError) as exc:
            return ToolOutput(f"edit_file refused: {exc}", True)
        count = text.count(args.old) if args.old else 0
        if count != 1:
            return ToolOutput(f"edit_file: `old` occurs {count} times in {args.path}; it must occur exactly once", True)
        path.write_text(text.replace(args.old, args.new, 1), encoding="utf-8")
        return ToolOutput(f"edited {args.path}")


class ListDirArgs(BaseModel):
    """Arguments of ``list_dir``."""

    path: str = "."


class ListDir(Tool[ListDirArgs]):
    """List a directory."""

    name = "list_dir"
    description = "List the entries of a directory of the work directory (directories end with /)."
    Args = ListDirArgs
    repeat_safe = True

    async def run(self, args: ListDirArgs, ctx: ToolContext) -> ToolOutput:
        try:
            path = confine(ctx.workdir, args.path)
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except (PathDenied, OSError) as exc:
            return ToolOutput(f"list_dir refused: {exc}", True)
        lines = [e.name + ("/" if e.is_dir(follow_symlinks=False) else "") for e in entries]
        return ToolOutput("\n".join(lines) if lines else "(empty)")


def file_tools() -> list[Tool[ReadFileArgs] | Tool[WriteFileArgs] | Tool[EditFileArgs] | Tool[ListDirArgs]]:
    """The built-in file tools."""
    return [ReadFile(), WriteFile(), EditFile(), ListDir()]
