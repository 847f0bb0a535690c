"""The checks' bookkeeping, shared by checks.py, manifests.py and pod.py: a check fails by raising
CheckFailed (expect), run_check runs one and records PASS or FAIL, and summary writes the last
line, `kubernetes: N passed, M failed`."""

from __future__ import annotations

import traceback
from pathlib import Path

RESULTS: list[tuple[str, str | None]] = []


class CheckFailed(Exception):
    pass


def expect(condition: bool, why: str) -> None:
    if not condition:
        raise CheckFailed(why)


def run_check(name: str, function, *args) -> bool:
    """Runs one named check, printing and recording PASS or FAIL; answers whether it passed."""
    try:
        function(*args)
    except CheckFailed as failure:
        RESULTS.append((name, str(failure)))
        print(f"FAIL {name}: {failure}", flush=True)
        return False
    except Exception:  # noqa: BLE001 - a crash is this check's failure, not the run's
        RESULTS.append((name, traceback.format_exc()))
        print(f"FAIL {name}:\n{traceback.format_exc()}", flush=True)
        return False
    RESULTS.append((name, None))
    print(f"PASS {name}", flush=True)
    return True


def summary(path: Path) -> int:
    failed = sum(1 for _, why in RESULTS if why is not None)
    line = f"kubernetes: {len(RESULTS) - failed} passed, {failed} failed"
    path.write_text(line + "\n")
    print(line)
    return 1 if failed else 0
