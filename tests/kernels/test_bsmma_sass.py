"""The SM12x code of the block-scaled GEMM, read from the built extension on a CPU (skips without it, as
test_build.py does): every instance of bsmma_gemm_kernel that the SM12x plans pick (each instruction at mt 1 and 4)
issues the block-scaled MMA in its sm_120a and sm_121a SASS, and no bsmma kernel of any target has a stack frame or
local memory. The mnemonics are what ptxas 13 writes for the three PTX forms:
OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X (kind::mxf4nvf4, NVFP4), QMMA.SF.16832.F32.E4M3.E4M3.E8 (kind::mxf8f6f4, MXF8)
and QMMA.SF.16832.F32.E2M1.E4M3.E8 (MXF4_MXF8); FP8 × fp8's plain E4M3 mma.sync is QMMA.16832.F32.E4M3.E4M3 (its
sm_90 code: HMMA.16816.F32, ptxas's emulation)."""

from __future__ import annotations

import re

from test_build import cuobjdump

SASS = {"NVFP4": "OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X", "MXF8": "QMMA.SF.16832.F32.E4M3.E4M3.E8",
        "MXF4_MXF8": "QMMA.SF.16832.F32.E2M1.E4M3.E8", "FP8": "QMMA.16832.F32.E4M3.E4M3"}  # fmt: skip
# bsmma::NVFP4 etc., or bsmma_gemm.cu's own FP8 (in its anonymous namespace)
KERNEL = re.compile(r"bsmma_gemm_kernelIN(?:S_5bsmma\d+|S0_\d+)(\w+?)ELi(\d)E")


def _functions(listing: str):
    """(arch, function name, its lines) of a cuobjdump -sass listing. A function ends at the next function or at the
    next cubin's header, and belongs to the architecture its own cubin's header named."""
    arch, name, name_arch, body = "", "", "", []
    for line in listing.splitlines():
        starts = line.strip().startswith("Function : ")
        if name and (starts or line.startswith("arch = ")):
            yield name_arch, name, body
            name = ""
        if line.startswith("arch = "):
            arch = line.split()[-1]
        elif starts:
            name, name_arch, body = line.split(":", 1)[1].strip(), arch, []
        elif name:
            body.append(line)
    if name:
        yield name_arch, name, body


def _bsmma_sass() -> str:
    """cuobjdump -sass of the bsmma_gemm kernels alone, every target (the whole fat binary takes over a minute)."""
    names = sorted(set(re.findall(r"_ZN\w*bsmma_gemm_kernel\w*", cuobjdump("-ltext"))))
    assert names, "no bsmma_gemm_kernel in the fat binary's text sections"
    return cuobjdump("-sass", "-fun", ",".join(names))


def test_every_sm12x_bsmma_kernel_issues_the_block_scaled_mma():
    seen = set()
    for arch, name, body in _functions(_bsmma_sass()):
        found = KERNEL.search(name)
        if not found or arch not in ("sm_120a", "sm_121a"):
            continue
        instruction, mt = found.group(1), int(found.group(2))
        text = "\n".join(body)
        assert SASS[instruction] in text, f"{arch} {name}: no {SASS[instruction]}"
        others = {m for m in set(SASS.values()) - {SASS[instruction]} if m in text}
        assert not others, f"{arch} {name}: {others}"
        seen.add((arch, instruction, mt))
    want = {(arch, i, mt) for arch in ("sm_120a", "sm_121a") for i in SASS for mt in (1, 4)}
    assert seen == want, want - seen


def test_bsmma_kernels_have_no_stack_or_local_memory():
    arch, name, seen = "", "", 0
    for line in cuobjdump("-res-usage").splitlines():
        if line.startswith("arch = "):
            arch = line.split()[-1]
        elif line.strip().startswith("Function ") and "bsmma_" in line:
            name = line.strip()
        elif "REG:" in line and name:
            usage = dict(field.split(":") for field in line.split())
            assert usage["STACK"] == "0" and usage["LOCAL"] == "0", f"{arch} {name} {line.strip()}"
            seen += 1
        if "REG:" in line:
            name = ""
    assert seen == 3 * 11, seen  # per target: four instructions × (mt 1, mt 4), three activation passes (not FP8)
