"""check.py OURS.xml: ours must pass every test in torch_passes.txt except those in excepted.txt (each with its
reason). Prints what falls short, and exceptions that no longer apply; exits 1 if ours falls short."""

import sys
from pathlib import Path

from summarize import load

here = Path(__file__).parent


def listed(name: str) -> dict[str, str]:
    rows = (line.split("\t", 1) for line in (here / name).read_text().splitlines() if line and line[0] != "#")
    return {row[0]: (row[1] if len(row) > 1 else "") for row in rows}


ours = load(sys.argv[1])
bar, excepted = listed("torch_passes.txt"), listed("excepted.txt")
short = [n for n in sorted(bar) if n not in excepted and ours.get(n, ("missing", ""))[0] != "passed"]
stale = [n for n in sorted(excepted) if ours.get(n, ("", ""))[0] == "passed"]
passed = sum(ours.get(n, ("",))[0] == "passed" for n in bar)
print(f"ours passes {passed} of the {len(bar)} tests torch passes; {len(excepted)} excepted (excepted.txt)")
for n in short:
    print(f"FAILS  {n}\t{ours.get(n, ('missing', ''))[1][:200]}")
for n in stale:
    print(f"passes now, drop from excepted.txt: {n}")
sys.exit(1 if short else 0)
