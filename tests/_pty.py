"""Running a command on a pseudo-terminal, for the tests of what ``orchestra run`` draws there."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping


def run_in_pty(args: list[str], cols: int, rows: int, *, cwd: str | os.PathLike[str], timeout: float = 90,
               env: Mapping[str, str | None] | None = None) -> tuple[int, list[tuple[float, bytes]]]:
    """``args`` with stdout and stderr on a ``cols`` x ``rows`` pseudo-terminal (TERM
    xterm-256color, COLUMNS/LINES set; ``env`` adds variables, None removes one): its exit
    status and what it wrote, as (seconds since the start, bytes) chunks."""
    import fcntl
    import select
    import struct
    import termios

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    full = dict(os.environ, PYTHONIOENCODING="utf-8", COLUMNS=str(cols), LINES=str(rows), TERM="xterm-256color")
    for k, v in (env or {}).items():
        if v is None:
            full.pop(k, None)
        else:
            full[k] = v
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=full, cwd=cwd)
    os.close(slave)
    chunks: list[tuple[float, bytes]] = []
    t0 = time.monotonic()
    try:
        while time.monotonic() < t0 + timeout:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed its end
                    break
                if not chunk:
                    break
                chunks.append((time.monotonic() - t0, chunk))
            elif proc.poll() is not None:
                break
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return rc, chunks
