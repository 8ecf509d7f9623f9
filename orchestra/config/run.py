"""``[run]``: how long to run and how often the policy engine and the signals run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._base import Checker, _any_bad

_RUN_KEYS = ("duration_s", "engine_period_s", "poll_interval_s")


@dataclass(frozen=True)
class RunConfig:
    """How long to run (None: until interrupted) and how often the policy engine runs."""

    duration_s: float | None = None
    engine_period_s: float = 1.0
    poll_interval_s: float | None = None


class RunChecks(Checker):
    """Checks ``[run]``; sets ``run_config``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.run_config = RunConfig()

    def check_run(self, value: Any) -> None:
        t = self.table(value, "run")
        if t is None:
            return
        self.known(t, "run", _RUN_KEYS)
        duration = self.get(t, "duration_s", "run", "positive_number", None)
        period = self.get(t, "engine_period_s", "run", "positive_number", 1.0)
        poll = self.get(t, "poll_interval_s", "run", "positive_number", None)
        if not _any_bad(duration, period, poll):
            self.run_config = RunConfig(duration, period, poll)

