"""The device function of SM12x's block-scaled mma.sync (csrc/block_scaled_mma.cuh) against the NumPy model
(b12x_kernels.block_scaled_mma), lane by lane and bit for bit:
- on a GPU, through the probe (`b12x_kernels.block_scaled_mma_probe`): the emulation on sm_90, the instruction itself
  on sm_120a / sm_121a (there a difference is the model's, or the tables', not the emulation's);
- on the CPU, the emulation in a simulated warp (tests/kernels/block_scaled_host_warp.cpp, built with g++);
- and the header the device code reads its tables from is the one the model renders now.
Inputs: random codes and selectors, every scale code (NaN ones included), NaN elements, C with zeros of both signs,
and junk in the scale bytes and lanes the selectors do not pick."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from test_block_scaled_model import fragments

import b12x_kernels
from b12x_kernels import block_scaled_mma as bsm

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "packages/b12x-kernels/csrc"
INSTRUCTIONS = list(bsm.DEVICE_INSTRUCTIONS.items())
POISON = np.uint32(0xFFBADBAD)  # a NaN no arithmetic makes: D's registers before the probe writes them


def _ids(item) -> str:
    return item[0]


def probe_inputs(instr: bsm.BlockScaledMma, rng: np.random.Generator, f: int) -> dict:
    """f fragments' lane registers and selectors: half with typical scales, half with every scale code; a few NaN
    elements (e4m3) and NaN scales, a few C zeros of either sign."""
    parts = [fragments(instr, rng, n, spread)[1] for n, spread in ((f // 2, "typical"), (f - f // 2, "full"))]
    regs = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    a = bsm.unpack_a(instr, regs["a"])
    if instr.atype == bsm.E4M3:
        a[rng.random(a.shape) < 0.002] = 0xFF
        regs["a"] = bsm.pack_a(instr, a)
    sa = bsm.read_scales_a(instr, regs["sfa"], regs["byte_id_a"], regs["thread_id_a"])
    sa[rng.random(sa.shape) < 0.002] = 0x7F if instr.stype == bsm.UE4M3 else 0xFF
    # the new scales into the bytes the selectors read; the other bytes keep their junk
    read = bsm.pack_scales_a(instr, np.full_like(sa, 0xFF), regs["byte_id_a"], regs["thread_id_a"])
    regs["sfa"] = (regs["sfa"] & ~read) | bsm.pack_scales_a(instr, sa, regs["byte_id_a"], regs["thread_id_a"])
    c = regs["c"].copy()
    c[rng.random(c.shape) < 0.03] = 0.0
    c[rng.random(c.shape) < 0.03] = -0.0
    regs["c"] = c
    return regs


def model(instr: bsm.BlockScaledMma, regs: dict, chunk: int = 2048) -> np.ndarray:
    """The model's D [F, 32, 4], a chunk of fragments at a time (its intermediates are F × 16 × 8 × K float64)."""
    f = regs["a"].shape[0]
    out = np.empty((f, 32, 4), dtype=np.float32)
    for lo in range(0, f, chunk):
        out[lo : lo + chunk] = bsm.mma(instr, **{k: v[lo : lo + chunk] for k, v in regs.items()})
    return out


def first_difference(instr, regs, got: np.ndarray, want: np.ndarray, what: str) -> str:
    """'' when got and want agree bit for bit (any NaN matching any NaN), else where they first differ."""
    gb, wb = got.view(np.uint32), want.view(np.uint32)
    unwritten = gb == POISON
    same = ((gb == wb) | (np.isnan(got) & np.isnan(want))) & ~unwritten
    if same.all():
        return ""
    f, lane, i = (int(x) for x in np.argwhere(~same)[0])
    frag = bsm.FRAGMENTS[instr.k]["c"]
    sel = {k: int(regs[k][f]) for k in ("byte_id_a", "thread_id_a", "byte_id_b", "thread_id_b")}
    return (
        f"{what} and the model differ at {np.count_nonzero(~same)} of {same.size} registers "
        f"({np.count_nonzero(unwritten)} never written); the first: fragment {f} (of the launch order), lane {lane}, d{i} "
        f"(D[{frag.rows[lane, i]}, {frag.cols[lane, i]}]), selectors {sel}: got {got[f, lane, i]!r} "
        f"({gb[f, lane, i]:#010x}), the model {want[f, lane, i]!r} ({wb[f, lane, i]:#010x})"
    )


# ---------------------------------------------------------------------------------------------------------------
# CPU


def test_generated_header_is_current():
    text = (ROOT / bsm.HEADER).read_text()
    assert text == bsm.tables_header(), "run python -m b12x_kernels.block_scaled_mma --write"


def test_kind_ids_are_the_headers():
    text = bsm.tables_header()
    for name, instr in bsm.DEVICE_INSTRUCTIONS.items():
        assert f"KIND_{name} = {bsm.kind_id(instr)}," in text
        assert f'#define B12X_BSMMA_PTX_{name} "{instr.ptx}"' in text


def test_probe_binding_exists_when_built():
    """The binding is there and refuses what the kernel cannot run before it touches a device."""
    if b12x_kernels._C is None:
        pytest.skip(b12x_kernels.unavailable_reason())
    assert b12x_kernels.block_scaled_mma_probe is b12x_kernels._C.block_scaled_mma_probe
    args = dict(a=16, b=16, c=16, sfa=16, sfb=16, d=16, fragments=1, byte_id_a=0, thread_id_a=0, byte_id_b=0,
                thread_id_b=0, stream=0)  # fmt: skip
    with pytest.raises(ValueError, match="kind"):
        b12x_kernels.block_scaled_mma_probe(kind=len(INSTRUCTIONS), **args)
    with pytest.raises(ValueError, match="Table 40"):
        b12x_kernels.block_scaled_mma_probe(kind=bsm.kind_id(bsm.MXF4), **{**args, "byte_id_a": 1})
    with pytest.raises(ValueError, match="Table 40"):
        b12x_kernels.block_scaled_mma_probe(kind=bsm.kind_id(bsm.NVFP4), **{**args, "thread_id_a": 2})
    with pytest.raises(ValueError, match="null"):
        b12x_kernels.block_scaled_mma_probe(kind=0, **{**args, "d": 0})


# The SASS each probe kernel holds on SM12x: its instruction once per selector combination of Table 40.
SASS = {
    "NVFP4": ("OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X", 8),
    "MXF4": ("OMMA.SF.16864.F32.E2M1.E2M1.E8", 32),
    "MXF8": ("QMMA.SF.16832.F32.E4M3.E4M3.E8", 128),
    "MXF4_MXF8": ("QMMA.SF.16832.F32.E2M1.E4M3.E8", 128),
}


def probe_mmas(sass: str) -> dict[tuple[str, str], Counter]:
    """cuobjdump -sass of the probe kernels -> (arch, instruction name) -> the tensor-core opcodes it issues."""
    out: dict[tuple[str, str], Counter] = {}
    arch, key = "", None
    for line in sass.splitlines():
        if line.startswith("arch = "):
            arch = line.split()[-1]
        elif "Function :" in line:
            m = re.search(r"bsmma(\d+)", line)
            key = (arch, line[m.end() : m.end() + int(m.group(1))])
            out[key] = Counter()
        elif key and (op := re.search(r"\b([A-Z]MMA\.[A-Z0-9._]+)", line)):
            out[key][op.group(1)] += 1
    return out


def test_probe_issues_the_block_scaled_mma_on_sm12x_only():
    """In the built extension, each probe kernel's sm_120a and sm_121a code holds its instruction (OMMA.SF.16864 for
    .kind::mxf4nvf4, QMMA.SF.16832 for .kind::mxf8f6f4) once per selector combination and no other MMA; its sm_90
    code (the emulation) none."""
    from test_build import cuobjdump

    usage = cuobjdump("-res-usage").splitlines()
    names = sorted({line.split()[1].rstrip(":") for line in usage if "block_scaled_mma_probe_kernel" in line})
    assert len(names) == len(INSTRUCTIONS), names
    found = probe_mmas(cuobjdump("-sass", "-fun", ",".join(names)))
    for name, _ in INSTRUCTIONS:
        op, combinations = SASS[name]
        for arch in ("sm_120a", "sm_121a"):
            assert found[(arch, name)] == Counter({op: combinations}), (arch, name, found[(arch, name)])
        assert found[("sm_90", name)] == Counter(), found[("sm_90", name)]


@pytest.fixture(scope="module")
def host_warp(tmp_path_factory) -> Path:
    """tests/kernels/block_scaled_host_warp.cpp built with g++ (skips without one)."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found")
    out = tmp_path_factory.mktemp("host_warp")
    (out / "shim").mkdir()
    (out / "shim" / "cuda_runtime.h").write_text("")
    exe = out / "host_warp"
    src = Path(__file__).with_name("block_scaled_host_warp.cpp")
    cmd = [gxx, "-std=c++20", "-O1", "-pthread", f"-I{out / 'shim'}", f"-I{CSRC}", str(src), "-o", str(exe)]
    build = subprocess.run(cmd, capture_output=True, text=True)
    if build.returncode != 0 and "barrier" in build.stderr:
        pytest.skip(f"g++ without C++20's <barrier>: {build.stderr[:200]}")
    assert build.returncode == 0, build.stderr
    return exe


@pytest.mark.slow
@pytest.mark.parametrize("item", INSTRUCTIONS, ids=_ids)
def test_emulation_in_a_simulated_warp_matches_the_model(item, rng, host_warp, tmp_path):
    name, instr = item
    f = 256
    regs = probe_inputs(instr, rng, f)
    sel = np.stack([regs[k] for k in ("byte_id_a", "thread_id_a", "byte_id_b", "thread_id_b")], -1)
    path = tmp_path / "in.bin"
    with open(path, "wb") as out:
        for key, dtype in (
            ("a", np.uint32),
            ("b", np.uint32),
            ("c", np.float32),
            ("sfa", np.uint32),
            ("sfb", np.uint32),
        ):
            out.write(np.ascontiguousarray(regs[key], dtype=dtype).tobytes())
        out.write(np.ascontiguousarray(sel, dtype=np.int32).tobytes())
    subprocess.run([str(host_warp), str(bsm.kind_id(instr)), str(f), str(path), str(tmp_path / "d.bin")], check=True)
    got = np.fromfile(tmp_path / "d.bin", dtype=np.float32).reshape(f, 32, 4)
    message = first_difference(instr, regs, got, model(instr, regs), f"{name}: the emulation (simulated warp)")
    assert not message, message


# ---------------------------------------------------------------------------------------------------------------
# GPU


def _gpu_params():
    for name, instr in INSTRUCTIONS:
        marks = [pytest.mark.fast] if name == "NVFP4" else []
        yield pytest.param((name, instr), id=name, marks=marks)


@pytest.mark.gpu
@pytest.mark.parametrize("item", list(_gpu_params()))
def test_probe_matches_the_model_bit_for_bit(item, rng):
    """10^5 random fragments, each with its own random selectors (one launch per selector combination)."""
    import torch

    name, instr = item
    major, minor = torch.cuda.get_device_capability()
    if major not in (9, 12):
        pytest.skip(f"sm_{major}{minor}: the extension holds code for sm_90, sm_120a and sm_121a only")
    what = f"{name} on sm_{major}{minor}: " + ("the instruction" if major == 12 else "the emulation")
    f = 100_000
    regs = probe_inputs(instr, rng, f)
    combination = ((regs["byte_id_a"] * 2 + regs["thread_id_a"]) * 4 + regs["byte_id_b"]) * 4 + regs["thread_id_b"]
    order = np.argsort(combination, kind="stable")  # fragments of one combination contiguous: a launch each
    regs = {k: v[order] for k, v in regs.items()}
    combination = combination[order]
    dtypes = {"a": np.int32, "b": np.int32, "c": np.float32, "sfa": np.int32, "sfb": np.int32}  # uint32 as int32
    dev = {k: torch.from_numpy(np.ascontiguousarray(regs[k]).view(t)).cuda() for k, t in dtypes.items()}
    d = torch.full((f, 32, 4), np.array(POISON).view(np.int32).item(), dtype=torch.int32, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    starts = np.flatnonzero(np.r_[True, combination[1:] != combination[:-1]])
    for lo, hi in zip(starts, np.r_[starts[1:], f], strict=True):
        at = {k: t.data_ptr() + int(lo) * t[0].numel() * 4 for k, t in (*dev.items(), ("d", d))}  # fragment lo
        b12x_kernels.block_scaled_mma_probe(
            kind=bsm.kind_id(instr), a=at["a"], b=at["b"], c=at["c"], sfa=at["sfa"], sfb=at["sfb"], d=at["d"],
            fragments=int(hi - lo),
            byte_id_a=int(regs["byte_id_a"][lo]), thread_id_a=int(regs["thread_id_a"][lo]),
            byte_id_b=int(regs["byte_id_b"][lo]), thread_id_b=int(regs["thread_id_b"][lo]), stream=stream,
        )  # fmt: skip
    torch.cuda.synchronize()
    got = d.cpu().numpy().view(np.float32)
    message = first_difference(instr, regs, got, model(instr, regs), what)
    assert not message, message
