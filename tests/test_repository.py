"""Repository-level contracts: one shared version, import hygiene, no package named `b12x`."""

import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import version as versioning  # noqa: E402

MODULES = ["b12x_formats", "b12x_kernels", "b12x_core", "b12x_vllm"]


def test_all_packages_share_one_version_and_pins():
    found = versioning.versions()
    assert set(found) == set(versioning.PACKAGES)
    assert len(set().union(*found.values())) == 1, found
    current = next(iter(found["b12x-formats"]))
    for module in MODULES:
        assert importlib.import_module(module).__version__ == current


def test_version_bump_moves_everything_together(tmp_path):
    for name in versioning.PACKAGES:
        shutil.copytree(
            ROOT / "packages" / name, tmp_path / "packages" / name, ignore=shutil.ignore_patterns("*.egg-info")
        )
    versioning.bump("7.8.9", root=tmp_path)
    assert all(v == {"7.8.9"} for v in versioning.versions(tmp_path).values())
    assert '"b12x-core==7.8.9"' in (tmp_path / "packages/b12x-vllm/pyproject.toml").read_text()
    with pytest.raises(ValueError, match="X.Y.Z"):
        versioning.bump("1.2", root=tmp_path)


def test_formats_import_does_not_import_torch():
    code = "import sys, b12x_formats as bf; bf.quantize([[1.0] * 32], 'Q8_0'); print('torch' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )


def test_no_import_package_named_b12x():
    for src in ROOT.glob("packages/*/src"):
        assert not (src / "b12x").exists() and not (src / "b12x.py").exists()
    assert sorted(
        p.name for p in ROOT.glob("packages/*/src/*") if p.is_dir() and not p.name.endswith("egg-info")
    ) == sorted(MODULES)


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, imported names) of every import statement in a Python file."""
    import ast

    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append((node.module, [alias.name for alias in node.names]))
    return out


# The one exception: `python -m b12x_kernels.selftest` hands over to b12x_core.selftest (the self-test runs core's plans
# and reference), importing it inside its main(); tests/core/test_selftest.py checks that importing the entry imports
# no b12x_core module.
HANDS_OVER = ("b12x_kernels/selftest.py", "b12x_core.selftest")


def test_layering_kernels_never_import_core_or_the_plugin():
    for path in (ROOT / "packages/b12x-kernels/src").rglob("*.py"):
        for module, _ in _imports(path):
            if (path.relative_to(ROOT / "packages/b12x-kernels/src").as_posix(), module) == HANDS_OVER:
                continue
            assert not module.startswith(("b12x_core", "b12x_vllm")), (path, module)


def test_layering_formats_imports_no_torch_at_import_time():
    """Every module of b12x_formats imports without torch (the [convert] tools import it inside functions)."""
    code = (
        "import importlib, pkgutil, sys, b12x_formats\n"
        "for m in pkgutil.walk_packages(b12x_formats.__path__, 'b12x_formats.'):\n"
        "    importlib.import_module(m.name)\n"
        "print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


# b12x_formats' modules behind its CLI (the demo builds a checkpoint as `b12x-formats quantize` does)
# The formats' tool modules (what the CLI runs: checkpoint I/O, GGUF import, quantize and its layer choice),
# public for tools such as the plugin's demo.
FORMATS_TOOLS = {"b12x_formats.modelopt", "b12x_formats.example", "b12x_formats.hf_quantize", "b12x_formats.inspect",
                 "b12x_formats.checkpoint", "b12x_formats.gguf_convert", "b12x_formats.layer_choice"}  # fmt: skip


def test_layering_the_plugin_uses_only_public_names():
    """b12x_vllm reaches b12x_core and b12x_formats through their public names only (`__all__`, and the
    formats tools), so their internals can move without breaking it."""
    import ast

    import b12x_core as bc
    import b12x_formats as bf

    public = {"b12x_core": set(bc.__all__), "b12x_formats": set(bf.__all__)}
    aliases = {"bc": "b12x_core", "bf": "b12x_formats"}
    for path in (ROOT / "packages/b12x-vllm/src").rglob("*.py"):
        for module, names in _imports(path):
            if not module.startswith(("b12x_core", "b12x_formats")):
                continue
            if module in public:
                assert set(names) <= public[module], (path, module, set(names) - public[module])
            else:
                assert module in FORMATS_TOOLS, (path, module)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                assert node.attr in public[aliases[node.value.id]], (path, f"{node.value.id}.{node.attr}")


CORE = ROOT / "packages/b12x-core/src"


def _core_import_graph() -> dict[str, set[str]]:
    """b12x_core module -> the b12x_core modules it imports, read statically (function-level imports included,
    relative imports resolved). `from pkg import name` counts as importing `pkg.name` when that is a module, else
    `pkg`; the parent packages Python runs on the way are left out (every module would meet `__init__`)."""
    import ast

    modules = {}
    for path in (CORE / "b12x_core").rglob("*.py"):
        parts = list(path.relative_to(CORE).with_suffix("").parts)
        package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if package else parts)] = (path, package)
    graph = {}
    for name, (path, package) in modules.items():
        here = name.split(".") if package else name.split(".")[:-1]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                parts = here[: len(here) - node.level + 1] if node.level else []
                base = ".".join(parts + ([node.module] if node.module else []))
                found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of `graph` as a path [a, b, ..., a], or [] when there is none."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = "done"
        stack.pop()
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_core_has_no_import_cycles():
    """Every b12x_core module imports only modules below it, so each can be read (and moved) on its own."""
    assert _cycle(_core_import_graph()) == []


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]


def test_no_backend_module_imports_another():
    """Backends share code through shared modules (operands, moe_blocks, the kernel family folders), never by
    importing a sibling backend: a new backend must not have to drag another one along."""
    import inspect

    from b12x_core.backends import Backend

    graph = _core_import_graph()
    backend_modules = set()
    for name in graph:
        if name.startswith("b12x_core.backends."):
            module = importlib.import_module(name)
            if any(
                inspect.isclass(v) and issubclass(v, Backend) and v is not Backend and v.__module__ == name
                for v in vars(module).values()
            ):
                backend_modules.add(name)
    assert {"b12x_core.backends.reference", "b12x_core.backends.tensor_core"} <= backend_modules
    borrowed = {(m, t) for m in backend_modules for t in graph[m] & backend_modules}
    assert borrowed == set()


def test_kernels_have_no_switches_from_outside_the_build():
    """The CUDA sources compile to one kernel per configuration an argument block names: they read no environment
    variable, and every preprocessor condition tests only the compiler's architecture (`__CUDA_ARCH__`,
    `__CUDA_ARCH_FEAT_*`) or a macro the sources define themselves. An experiment's build switch (`#ifndef B12X_X`
    with a default, or `#ifdef` of a macro only `-D` sets) or an environment switch (getenv) fails here; an A/B
    edits a copy of the sources instead (tools/kernel_ab.sh)."""
    import re

    csrc = sorted((ROOT / "packages/b12x-kernels/csrc").iterdir())
    texts = {path.name: path.read_text() for path in csrc}
    defined = {m for text in texts.values() for m in re.findall(r"^\s*#\s*define\s+(\w+)", text, re.M)}
    found = []
    for name, text in texts.items():
        lines = text.splitlines()
        for i, line in enumerate(lines):
            if "getenv" in line:
                found.append(f"{name}:{i + 1} reads the environment: {line.strip()}")
            cond = re.match(r"\s*#\s*(if|ifdef|ifndef|elif)\b(.*)", line)
            if not cond:
                continue
            names = set(re.findall(r"[A-Za-z_]\w*", cond.group(2).split("//")[0])) - {"defined"}
            outside = {n for n in names if not n.startswith("__CUDA_ARCH") and n not in defined}
            if outside:
                found.append(f"{name}:{i + 1} tests {sorted(outside)}, which no source defines: {line.strip()}")
            nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
            if cond.group(1) == "ifndef" and nxt.startswith(f"#define {cond.group(2).strip()}"):
                found.append(f"{name}:{i + 1} gives {cond.group(2).strip()} a default the build may override")
    assert not found, "\n".join(found)


# How the work on b12x went is git's to keep; the repository speaks of b12x. Each pattern is written so that it does
# not match its own source text (a character class splits the words).
PROCESS_SPEAK = {
    "a numbered work period": r"\b(?:(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|"
    r"twelfth|thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|thirtieth|"
    r"twenty-\w+|thirty-\w+|\d+(?:st|nd|rd|th))\s+(?:device\s+)?[s]ession|devic[e]\s+sessions?|[s]ession\s+\d+)\b",
    "a GPU lent, or its time budget": r"\b(?:devic[e][- ]time|len[t]\s+(?:device|gpu|machine|h100|h200|nvidia|half)|"
    r"th[e]\s+lent\b|loa[n](?:s|ed)?|refuse[d]\s+starts?)\b",
    "a call to a device": r"\bdevic[e][- ]calls?\b",
    "a numbered call as a work step": r"\bcal[l]s?\s+\d+\b",
    "an issue-by-issue history": r"\bissue[s]?\s+\d+\b",
}
# docs/results/ holds raw measurement files (run logs, benchmark JSON, the scripts that made them): what a run
# printed, kept as it printed it for the pages that cite them.
RAW_RESULTS = "docs/results/"


def _tracked_text_files():
    """(path relative to ROOT, text) of every file git tracks that reads as UTF-8."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in filter(None, names.split("\0")):
        path = ROOT / name
        if not path.is_file():
            continue
        try:
            yield name, path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue


def _hits(files, patterns: dict[str, str]) -> list[str]:
    import re

    compiled = {what: re.compile(pattern, re.I) for what, pattern in patterns.items()}
    found = []
    for name, text in files:
        for i, line in enumerate(text.splitlines()):
            for what, pattern in compiled.items():
                if match := pattern.search(line):
                    found.append(f"{name}:{i + 1}: {what} ({match.group(0)!r}): {line.strip()[:120]}")
    return found


def _report(found: list[str]) -> str:
    return f"{len(found)} lines:\n" + "\n".join(found[:40]) + ("\n..." if len(found) > 40 else "")


def test_the_repository_speaks_of_the_project_alone():
    """No tracked line tells how the work was done (numbered work periods, GPUs lent and their time budgets, calls to
    a device, numbered calls, issue-by-issue history): a reader needs what b12x is and does, and such lines go
    stale."""
    files = [(name, text) for name, text in _tracked_text_files() if not name.startswith(RAW_RESULTS)]
    assert len(files) > 100, "git ls-files found too few files"
    found = _hits(files, PROCESS_SPEAK)
    assert not found, _report(found)


def test_process_speak_patterns_spare_ordinary_uses():
    ordinary = ["nox -s tests runs one session", "a test session's seed", "one function call", "calls 2x faster",
                "the device's time per call", "Triton issue #11584", "issue a copy", "the first call compiles"]  # fmt: skip
    # "_" for " " at the word break, so that this file's own lines do not match
    worded = ["the twenty-eighth_session (H200)", "the 3rd_session", "device_time ran out", "the lent_device",
              "before new_loans", "one device_call", "call_2: the fast tier", "issue_23's largest miss",
              "issues_22 and 23", "eight refused_starts"]  # fmt: skip
    assert _hits([("x", "\n".join(ordinary))], PROCESS_SPEAK) == []
    found = _hits([("x", line.replace("_", " ")) for line in worded], PROCESS_SPEAK)
    assert len(found) == len(worded), found


PACKAGE_SOURCES = (".py", ".cu", ".cuh", ".h", ".cpp", ".toml")


def test_package_sources_carry_no_dates():
    """Package sources (code, headers, build files) state why, not when: a date (YYYY-MM-DD) goes stale, and git
    knows it. Measured data (timings.json and the like) keeps its provenance."""
    files = [
        (name, text)
        for name, text in _tracked_text_files()
        if name.startswith("packages/") and (name.endswith(PACKAGE_SOURCES) or name.endswith("CMakeLists.txt"))
    ]
    assert any(name.endswith(".cu") for name, _ in files) and any(name.endswith(".py") for name, _ in files)
    found = _hits(files, {"a date": r"\b20\d\d-[01]\d-[0-3]\d\b"})
    assert not found, _report(found)


def _kernel_imports_of(path: Path) -> list[str]:
    """Every import of b12x_kernels in a Python file (function-level ones too), as written."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "b12x_kernels"]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module.split(".")[0] == "b12x_kernels":
            found.append(node.module)
    return found


def test_core_reaches_the_kernels_through_one_module():
    """b12x_core.kernels is the only module of b12x_core that imports b12x_kernels: what core asks of the device
    code (bindings, argument blocks, families' capability models, Triton modules) is listed in one place."""
    adapter = CORE / "b12x_core" / "kernels.py"
    assert _kernel_imports_of(adapter)
    others = {
        str(path.relative_to(CORE)): found
        for path in (CORE / "b12x_core").rglob("*.py")
        if path != adapter and (found := _kernel_imports_of(path))
    }
    assert others == {}
