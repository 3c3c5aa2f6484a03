"""tools/ncu_source_summary.py on a small source page in Nsight Compute's CSV form (what kernel_profile.sh saves)."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
           "Thread Instructions Executed"]  # fmt: skip


def test_summary_counts_opcodes_samples_and_instructions_a_weight(tmp_path, rng):
    sass = ["@!P0 LDS.U.128 R4, [R2+0x10]", "PRMT R31, R29, 0x5140, R30", "HMMA.16816.F32.BF16 R8, R4, R12, R8",
            "@P1 BRA 0x7f0", "PRMT R2, R3, 0x7362, R4", "BSSY B0, 0x7f70c37bb820"]  # fmt: skip
    executed = rng.integers(1, 10_000, len(sass))
    samples = rng.integers(0, 500, len(sass))
    samples[-1] = samples.max() + 1  # the barrier is the hottest
    path = tmp_path / "source.csv"
    with path.open("w", newline="") as f:
        f.write('"Kernel Name","void k<1>(P)",\n')
        writer = csv.writer(f, quoting=csv.QUOTE_ALL)
        writer.writerow(COLUMNS)
        for i, line in enumerate(sass):
            writer.writerow([f"0x7f70c37b{i:04x}", f"      {line}", samples[i], executed[i], 32 * executed[i]])
    weights = int(rng.integers(1000, 100_000))
    done = subprocess.run([sys.executable, str(ROOT / "tools/ncu_source_summary.py"), str(path), "--weights",
                           str(weights), "--top", "3"], capture_output=True, text=True, check=True)  # fmt: skip
    out = done.stdout
    assert out.startswith("## void k<1>(P)")
    assert f"warp instructions executed {executed.sum()} ({32 * executed.sum() / weights:.2f} thread" in out
    mix = dict(re.findall(r"(\w+) ([\d.]+)%", out.split("mix: ")[1].splitlines()[0]))
    assert set(mix) == {"LDS", "PRMT", "HMMA", "BRA", "BSSY"}  # predicates and modifiers stripped
    assert abs(float(mix["PRMT"]) - 100 * (executed[1] + executed[4]) / executed.sum()) < 0.06
    hottest = out.split("\n")[4:]
    assert "BSSY B0" in hottest[0] and len([h for h in hottest if h.strip()]) == 3
