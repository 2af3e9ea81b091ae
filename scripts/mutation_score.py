"""The mutation score per module from ``mutmut results --all true`` (scripts/mutation.sh,
benchmarks/results/mutation.md).

A mutant counts as killed when a test failed on it or it timed out (an endless loop the tests
caught); every other status (survived, no tests, suspicious) is listed by name afterwards.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

DETECTED = frozenset({"killed", "timeout"})


def main(path: str) -> int:
    lines = [line.strip().split(": ", 1) for line in Path(path).read_text().splitlines() if ": " in line]
    by_module: dict[str, list[str]] = defaultdict(list)
    for name, status in lines:
        # mutmut names a mutant module.x_function__mutmut_N or module.xǁClassǁmethod__mutmut_N
        by_module[name.split(".x_")[0].split(".xǁ")[0]].append(status)
    for module, statuses in sorted(by_module.items()):
        killed = sum(s in DETECTED for s in statuses)
        print(f"{module:45} {killed:4}/{len(statuses):<4} killed ({100 * killed / len(statuses):.1f} %)")
    total = sum(len(s) for s in by_module.values())
    killed = sum(s in DETECTED for statuses in by_module.values() for s in statuses)
    print(f"{'all':45} {killed:4}/{total:<4} killed ({100 * killed / max(total, 1):.1f} %)")
    for name, status in lines:
        if status not in DETECTED:
            print(f"    {status}: {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
