"""The HF <-> mcore mapping tables and split rules, against layouts written out by hand."""

from __future__ import annotations

import pytest
import torch

from mindrl.checkpoint.errors import ConversionError
from mindrl.checkpoint.mapping import (
    TABLES,
    Split,
    bound_rules,
    expected_hf_tensors,
    rules_for,
    te_name,
)
from mindrl.checkpoint.transforms import DictSource, hf_to_mcore, mcore_to_hf
from mindrl.config.model_arch import ModelArchConfig


def _arch(**kw) -> ModelArchConfig:
    base = dict(
        num_layers=3,
        hidden_size=16,
        ffn_hidden_size=24,
        num_attention_heads=8,
        vocab_size=37,
        max_position_embeddings=64,
        model_type_hf="qwen2",
        group_query_attention=True,
        num_query_groups=4,
        kv_channels=4,
        add_qkv_bias=True,
        untie_embeddings_and_output_weights=True,
    )
    base.update(kw)
    return ModelArchConfig(**base)


def _random_hf(arch: ModelArchConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        name: torch.randn(shape, generator=gen) for name, shape in expected_hf_tensors(arch).items()
    }


def test_every_hf_and_mcore_name_appears_once_per_table():
    for family, table in TABLES.items():
        if family not in ("llama", "qwen2", "qwen3", "qwen3_moe"):
            continue  # the MoE families with shared experts / MLA: test_moe_family_tables
        moe = {"num_experts": 4, "moe_ffn_hidden_size": 8} if family == "qwen3_moe" else {}
        arch = _arch(
            model_type_hf=family,
            add_qkv_bias=family == "qwen2",
            qk_layernorm=family in ("qwen3", "qwen3_moe"),
            untie_embeddings_and_output_weights=True,
            **moe,
        )
        bound = bound_rules(arch)
        mcore = [b.mcore for b in bound]
        hf = [name for b in bound for name in b.hf]
        assert len(mcore) == len(set(mcore)), family
        assert len(hf) == len(set(hf)), family
        # 9 tensors per layer for llama (q k v o gate up down + 2 norms), + 3 biases for qwen2,
        # + q/k norms for qwen3; qwen3_moe: a router and 4 x (gate up down) for gate up down
        per_layer = 9 + {"qwen2": 3, "qwen3": 2, "qwen3_moe": 2 + 1 + 4 * 3 - 3}.get(family, 0)
        assert len(hf) == 3 * per_layer + 3  # + embed, final norm, lm_head
        assert table  # the family has a table


def test_tied_model_has_no_lm_head_and_loads_output_copy_from_embedding():
    arch = _arch(untie_embeddings_and_output_weights=False)
    names = expected_hf_tensors(arch)
    assert "lm_head.weight" not in names
    load_only = [b for b in bound_rules(arch, include_load_only=True) if b.rule.load_only]
    assert [(b.mcore, b.hf) for b in load_only] == [
        ("output_layer.weight", ("model.embed_tokens.weight",))
    ]


def test_llama_table_refuses_qkv_bias():
    with pytest.raises(ConversionError, match="--add-qkv-bias"):
        rules_for(_arch(model_type_hf="llama2", add_qkv_bias=True))


def _expected_qkv_shard(q, k, v, arch, tp_rank, tp_size):
    """mcore's linear_qkv rows of one TP rank, written out head by head."""
    groups, d = arch.num_kv_heads, arch.head_dim
    qpg = arch.num_attention_heads // groups
    rows = []
    for g in range(tp_rank * groups // tp_size, (tp_rank + 1) * groups // tp_size):
        for h in range(g * qpg, (g + 1) * qpg):
            rows.append(q[h * d : (h + 1) * d])
        rows.append(k[g * d : (g + 1) * d])
        rows.append(v[g * d : (g + 1) * d])
    return torch.cat(rows)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_split_rules_match_hand_written_layouts(tp):
    arch = _arch(vocab_size=37)  # 37 rows: padded to 40 at TP 4, 38 at TP 2
    hf = _random_hf(arch)
    src = DictSource(hf)
    by_name = {b.mcore: b for b in bound_rules(arch)}
    ffn, hidden = arch.ffn_hidden_size, arch.hidden_size
    padded = -(-37 // tp) * tp
    for r in range(tp):
        p = "model.layers.1.self_attn."
        qkv = hf_to_mcore(
            by_name["decoder.layers.1.self_attention.linear_qkv.weight"], src, arch, r, tp
        )
        want = _expected_qkv_shard(
            hf[p + "q_proj.weight"], hf[p + "k_proj.weight"], hf[p + "v_proj.weight"], arch, r, tp
        )
        assert torch.equal(qkv, want)
        bias = hf_to_mcore(
            by_name["decoder.layers.1.self_attention.linear_qkv.bias"], src, arch, r, tp
        )
        want = _expected_qkv_shard(
            hf[p + "q_proj.bias"], hf[p + "k_proj.bias"], hf[p + "v_proj.bias"], arch, r, tp
        )
        assert torch.equal(bias, want)

        fc1 = hf_to_mcore(by_name["decoder.layers.2.mlp.linear_fc1.weight"], src, arch, r, tp)
        rows = slice(r * ffn // tp, (r + 1) * ffn // tp)
        gate, up = (
            hf["model.layers.2.mlp.gate_proj.weight"],
            hf["model.layers.2.mlp.up_proj.weight"],
        )
        assert torch.equal(fc1, torch.cat([gate[rows], up[rows]]))

        fc2 = hf_to_mcore(by_name["decoder.layers.0.mlp.linear_fc2.weight"], src, arch, r, tp)
        assert torch.equal(fc2, hf["model.layers.0.mlp.down_proj.weight"][:, rows])

        proj = hf_to_mcore(
            by_name["decoder.layers.0.self_attention.linear_proj.weight"], src, arch, r, tp
        )
        q_width = arch.num_attention_heads * arch.head_dim
        cols = slice(r * q_width // tp, (r + 1) * q_width // tp)
        assert torch.equal(proj, hf["model.layers.0.self_attn.o_proj.weight"][:, cols])

        norm = hf_to_mcore(by_name["decoder.layers.0.input_layernorm.weight"], src, arch, r, tp)
        assert torch.equal(norm, hf["model.layers.0.input_layernorm.weight"])

        emb = hf_to_mcore(by_name["embedding.word_embeddings.weight"], src, arch, r, tp)
        lo, hi = r * padded // tp, (r + 1) * padded // tp
        assert emb.shape == (padded // tp, hidden)
        real = hf["model.embed_tokens.weight"][lo : min(hi, 37)]
        assert torch.equal(emb[: real.shape[0]], real)
        assert torch.count_nonzero(emb[real.shape[0] :]) == 0  # padding rows are zero


@pytest.mark.parametrize("family", ["qwen2", "llama"])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_split_then_merge_is_bit_exact(family, tp):
    arch = _arch(model_type_hf=family, add_qkv_bias=family == "qwen2", vocab_size=41)
    hf = _random_hf(arch, seed=tp)
    src = DictSource(hf)
    rebuilt: dict[str, torch.Tensor] = {}
    for bound in bound_rules(arch):
        shards = [hf_to_mcore(bound, src, arch, r, tp) for r in range(tp)]
        if bound.split is Split.REPLICATED:
            assert all(torch.equal(s, shards[0]) for s in shards)
        rebuilt.update(mcore_to_hf(bound, shards, arch))
    assert rebuilt.keys() == hf.keys()
    for name, tensor in hf.items():
        assert torch.equal(rebuilt[name], tensor), name


def test_wrong_hf_shape_names_the_tensor():
    arch = _arch()
    hf = _random_hf(arch)
    hf["model.layers.2.self_attn.k_proj.weight"] = torch.zeros(5, 16)
    bound = {b.mcore: b for b in bound_rules(arch)}[
        "decoder.layers.2.self_attention.linear_qkv.weight"
    ]
    with pytest.raises(
        ConversionError, match=r"model\.layers\.2\.self_attn\.k_proj\.weight.*\[5, 16\]"
    ):
        hf_to_mcore(bound, DictSource(hf), arch, 0, 1)


def test_tp_must_divide_kv_heads():
    arch = _arch()  # 4 kv heads
    bound = {b.mcore: b for b in bound_rules(arch)}[
        "decoder.layers.0.self_attention.linear_qkv.weight"
    ]
    with pytest.raises(ConversionError, match="kv heads"):
        hf_to_mcore(bound, DictSource(_random_hf(arch)), arch, 0, 8)


def test_te_names_for_fused_norms():
    assert te_name("decoder.layers.3.input_layernorm.weight") == (
        "decoder.layers.3.self_attention.linear_qkv.layer_norm_weight"
    )
    assert te_name("decoder.layers.0.pre_mlp_layernorm.weight") == (
        "decoder.layers.0.mlp.linear_fc1.layer_norm_weight"
    )
    assert te_name("decoder.final_layernorm.weight") == "decoder.final_layernorm.weight"
