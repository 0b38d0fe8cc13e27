"""Every config key mindrl accepts has a fate: honoured (read by mindrl outside mindrl/config),
handed to what honours it on a backend, no effect (warned once), or refused with the feature
that is not built yet. Never accepted and ignored.

`honoured` is checked by reading the source: a small, flow-insensitive type scan of mindrl/
finds attribute reads whose receiver is known to be a config group (from annotations,
assignments, loops and `self.x` attributes), e.g. `run.actor.parallel.tensor_model_parallel_size` or
`alg.clip_ratio` with `alg: AlgorithmConfig`. Reads inside mindrl/config do not count (a key
only validated or copied there is not honoured), except through a property or method of a
config class that code outside reads (`role.tp` reads `tensor_model_parallel_size`).
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

import mindrl
from mindrl.config import ConfigError, compose_raw, load_run_config
from mindrl.config.build import build_run_config
from mindrl.config.fates import (
    MINDSPEED,
    TARGETS,
    VLLM_ASCEND,
    Handed,
    Honoured,
    NoEffect,
    Refused,
    fate_of,
    handoffs,
    key_fields,
    reset_warnings,
    section_fate,
    warned,
)
from mindrl.config.fields import _Problems, build_groups, field_names
from mindrl.config.generate import GenerateConfig, SamplingConfig
from mindrl.config.rl import RL_GROUPS
from mindrl.config.role import ROLE_GROUPS
from mindrl.config.run import RunConfig

ROOT = Path(mindrl.__file__).parent
BASE = "r1_zero_qwen25_7b"
Cls = tuple[str, str]  # (module, class name)
Type = frozenset  # of ("C", cls) an instance, ("L", cls) a container of instances,
# ("T", cls) the class itself, ("R", cls) a method returning an instance

# A declared fate whose field is read outside mindrl/config anyway, and why that is fine.
READ_DESPITE_FATE: dict[tuple[str, str], str] = {
    ("DataConfig", "stage"): "refused outside ray_grpo / ray_dapo; the trainer reads which one",
    ("ModelArchConfig", "rope_scaling_type"): "refused except llama3; the builder reads it",
    ("ParallelConfig", "context_parallel_algo"): "refused except ring / Ulysses / hybrid; the "
    "model builder reads which one",
}


# -- the scan -----------------------------------------------------------------------------------


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _inside_config(mod: str) -> bool:
    return mod == "mindrl.config" or mod.startswith("mindrl.config.")


class Index:
    """mindrl's modules: imported names, classes and top-level functions."""

    def __init__(self) -> None:
        self.trees = {_module_name(p): ast.parse(p.read_text()) for p in ROOT.rglob("*.py")}
        self.symbols: dict[str, dict[str, str]] = {}
        self.classes: dict[Cls, ast.ClassDef] = {}
        self.functions: dict[str, ast.FunctionDef] = {}
        for mod, tree in self.trees.items():
            syms: dict[str, str] = {}
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module:
                    base = node.module
                    if node.level:
                        base = ".".join(mod.split(".")[: -node.level] + [node.module])
                    for a in node.names:
                        syms[a.asname or a.name] = f"{base}.{a.name}"
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    syms[node.name] = f"{mod}.{node.name}"
                    self.classes[(mod, node.name)] = node
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    syms[node.name] = f"{mod}.{node.name}"
                    self.functions[f"{mod}.{node.name}"] = node
            self.symbols[mod] = syms
        self.by_qual = {f"{m}.{n}": (m, n) for m, n in self.classes}
        for _ in range(3):  # names re-exported by a package resolve to their definition
            for syms in self.symbols.values():
                for name, qual in list(syms.items()):
                    parent, _, leaf = qual.rpartition(".")
                    target = self.symbols.get(parent, {}).get(leaf)
                    if qual not in self.by_qual and target and target != qual:
                        syms[name] = target

    def resolve(self, mod: str, name: str) -> Cls | None:
        return self.by_qual.get(self.symbols.get(mod, {}).get(name, ""))

    def annotation(self, mod: str, node: ast.AST | None) -> Type:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return self.annotation(mod, ast.parse(node.value, mode="eval").body)
        if isinstance(node, ast.Name):
            cls = self.resolve(mod, node.id)
            return frozenset({("C", cls)}) if cls else frozenset()
        if isinstance(node, ast.BinOp):
            return self.annotation(mod, node.left) | self.annotation(mod, node.right)
        if isinstance(node, ast.Subscript):
            head = getattr(node.value, "id", getattr(node.value, "attr", ""))
            elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            inner = frozenset().union(*(self.annotation(mod, e) for e in elts))
            if head in ("Optional", "Union"):
                return inner
            return frozenset(("L", c) for k, c in inner if k == "C")
        return frozenset()


class Scan:
    """Attribute reads of config classes: outside mindrl/config, inside it, and per member
    (property / method) of a config class."""

    def __init__(self, ix: Index, config_classes: set[Cls]) -> None:
        self.ix = ix
        self.attrs: dict[Cls, dict[str, Type]] = {}
        for key, node in ix.classes.items():
            table = self.attrs.setdefault(key, {})
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    table[stmt.target.id] = ix.annotation(key[0], stmt.annotation)
                elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    ret = ix.annotation(key[0], stmt.returns)
                    prop = any(getattr(d, "id", "") == "property" for d in stmt.decorator_list)
                    table[stmt.name] = ret if prop else frozenset(("R", t) for t in ret)
        self.outside: set[tuple[Cls, str]] = set()
        self.inside: set[tuple[Cls, str]] = set()
        self.members: dict[tuple[Cls, str], set[tuple[Cls, str]]] = {}
        defs = [
            (mod, fn, owner) for mod, tree in ix.trees.items() for fn, owner in _defs(mod, tree)
        ]
        for _ in range(2):  # `self.x = ...` types settle after a pass
            for mod, fn, owner in defs:
                self.env(mod, fn, owner, {})
        for mod, fn, owner in defs:
            env = self.env(mod, fn, owner, {})
            reads = self.reads(mod, fn, env)
            for sub in ast.walk(fn):
                if sub is not fn and isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    reads |= self.reads(mod, sub, self.env(mod, sub, None, env))
            if owner in config_classes:
                self.members[(owner, fn.name)] = reads
            elif _inside_config(mod):
                self.inside |= reads
            else:
                self.outside |= reads

    def attr(self, owner: Cls, name: str) -> Type:
        todo, seen = [owner], set()
        while todo:
            key = todo.pop(0)
            if key in seen or key not in self.ix.classes:
                continue
            seen.add(key)
            if self.attrs.get(key, {}).get(name):
                return self.attrs[key][name]
            todo += [
                self.ix.resolve(key[0], b.id)
                for b in self.ix.classes[key].bases
                if isinstance(b, ast.Name)
            ]
        return frozenset()

    def type_of(self, mod: str, env: dict[str, Type], node: ast.AST) -> Type:
        if isinstance(node, ast.Name):
            if node.id in env:
                return env[node.id]
            cls = self.ix.resolve(mod, node.id)
            return frozenset({("T", cls)}) if cls else frozenset()
        if isinstance(node, ast.Attribute):
            out: set = set()
            for kind, owner in self.type_of(mod, env, node.value):
                if kind in ("C", "T"):
                    out |= self.attr(owner, node.attr)
            return frozenset(out)
        if isinstance(node, ast.Call):
            out = {("C", c) for k, c in self.type_of(mod, env, node.func) if k in ("T", "R")}
            if isinstance(node.func, ast.Name):
                qual = self.ix.symbols.get(mod, {}).get(node.func.id, "")
                fn = self.ix.functions.get(qual)
                if fn is not None:
                    out |= self.ix.annotation(qual.rpartition(".")[0], fn.returns)
            return frozenset(out)
        if isinstance(node, ast.BoolOp):
            return frozenset().union(*(self.type_of(mod, env, v) for v in node.values))
        if isinstance(node, ast.IfExp):
            return self.type_of(mod, env, node.body) | self.type_of(mod, env, node.orelse)
        if isinstance(node, ast.Subscript):
            return frozenset(("C", c) for k, c in self.type_of(mod, env, node.value) if k == "L")
        if isinstance(node, (ast.List, ast.Tuple)) and node.elts:
            inner = frozenset().union(*(self.type_of(mod, env, e) for e in node.elts))
            return frozenset(("L", c) for k, c in inner if k == "C")
        return frozenset()

    def env(self, mod: str, fn: Any, owner: Cls | None, outer: dict) -> dict[str, Type]:
        """Flow-insensitive types of the names in `fn` (parameters, assignments, loops)."""
        env = dict(outer)
        args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
        for i, a in enumerate(args):
            tp = self.ix.annotation(mod, a.annotation)
            if i == 0 and owner is not None and a.arg in ("self", "cls") and not tp:
                tp = frozenset({("C" if a.arg == "self" else "T", owner)})
            if tp:
                env[a.arg] = tp

        def bind(target: ast.AST, tp: Type) -> bool:
            if isinstance(target, ast.Tuple):  # `run, raw = f()`: each gets the elements
                elements = frozenset(("C", c) for k, c in tp if k == "L")
                return any([bind(t, elements) for t in target.elts])
            if isinstance(target, ast.Name) and tp - env.get(target.id, frozenset()):
                env[target.id] = env.get(target.id, frozenset()) | tp
                return True
            if (
                owner is not None
                and isinstance(target, ast.Attribute)
                and getattr(target.value, "id", "") == "self"
            ):
                table = self.attrs.setdefault(owner, {})
                if tp - table.get(target.attr, frozenset()):
                    table[target.attr] = table.get(target.attr, frozenset()) | tp
                    return True
            return False

        for _ in range(4):
            changed = False
            for node in ast.walk(fn):
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                            for t, v in zip(target.elts, node.value.elts):
                                changed |= bind(t, self.type_of(mod, env, v))
                        else:
                            changed |= bind(target, self.type_of(mod, env, node.value))
                elif isinstance(node, ast.AnnAssign):
                    tp = self.ix.annotation(mod, node.annotation)
                    if node.value is not None:
                        tp |= self.type_of(mod, env, node.value)
                    changed |= bind(node.target, tp)
                elif isinstance(node, (ast.For, ast.comprehension)):
                    items = self.type_of(mod, env, node.iter)
                    changed |= bind(node.target, frozenset(("C", c) for k, c in items if k == "L"))
                elif isinstance(node, ast.NamedExpr):
                    changed |= bind(node.target, self.type_of(mod, env, node.value))
                elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                    changed |= bind(node.optional_vars, self.type_of(mod, env, node.context_expr))
            if not changed:
                return env
        return env

    def reads(self, mod: str, fn: Any, env: dict[str, Type]) -> set[tuple[Cls, str]]:
        out = set()
        for node in ast.walk(fn):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                receiver, name = node.value, node.attr
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", "") == "getattr"
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
            ):
                receiver, name = node.args[0], node.args[1].value
            else:
                continue
            out |= {(c, name) for k, c in self.type_of(mod, env, receiver) if k == "C"}
        return out

    def honoured(self) -> set[tuple[Cls, str]]:
        """Read outside mindrl/config, directly or through a config class's members; a read
        of an inherited field counts for the subclass too (AlgorithmConfig's loss knobs are
        `GRPOLossConfig`'s fields, read by the loss from `AlgorithmConfig.loss_config`)."""
        seen, todo = set(self.outside), list(self.outside)
        while todo:
            for read in self.members.get(todo.pop(), ()):
                if read not in seen:
                    seen.add(read)
                    todo.append(read)
        for cls in self.ix.classes:
            for base in self.bases(cls):
                seen |= {(cls, name) for owner, name in list(seen) if owner == base}
        return seen

    def bases(self, cls: Cls) -> set[Cls]:
        """The mindrl classes `cls` inherits from, at any depth."""
        out: set[Cls] = set()
        todo = [cls]
        while todo:
            key = todo.pop()
            for b in self.ix.classes[key].bases:
                base = self.ix.resolve(key[0], b.id) if isinstance(b, ast.Name) else None
                if base is not None and base not in out and base in self.ix.classes:
                    out.add(base)
                    todo.append(base)
        return out


def _defs(mod: str, tree: ast.Module) -> Iterator[tuple[Any, Cls | None]]:
    """Every top-level function (owner None) and method (owner its class) of a module."""
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef)
    for node in tree.body:
        if isinstance(node, kinds):
            yield node, None
        elif isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, kinds):
                    yield stmt, (mod, node.name)


def _key(cls: type) -> Cls:
    return (cls.__module__, cls.__qualname__)


@cache
def scan() -> Scan:
    ix = Index()
    classes = {_key(cls) for _, cls, _ in key_fields(RunConfig)}
    classes |= {_key(cls) for cls in _containers()}
    return Scan(ix, classes)


def _containers() -> list[type]:
    from mindrl.config.rl import RLConfig
    from mindrl.config.role import RoleConfig

    return [RunConfig, RoleConfig, RLConfig]


def accepted_fields() -> dict[tuple[type, str], dataclasses.Field]:
    """Every field of every config group (each once, whichever role section shows it)."""
    return {(cls, f.name): f for _, cls, f in key_fields(RunConfig)}


# -- every key has a fate -----------------------------------------------------------------------


def test_the_scan_sees_known_reads_and_misses_unread_keys():
    """Guards the scan itself: reads through a chain, an annotated parameter, a property, a
    tuple-unpacked call; and a key known to be unread is not found."""
    honoured = scan().honoured()
    from mindrl.config.rl import AlgorithmConfig
    from mindrl.config.role import CheckpointConfig, ParallelConfig
    from mindrl.config.run import RuntimeConfig

    assert (_key(CheckpointConfig), "save_interval") in honoured  # run.actor.ckpt.x
    assert (_key(AlgorithmConfig), "clip_ratio") in honoured  # alg: AlgorithmConfig
    assert (_key(ParallelConfig), "tensor_model_parallel_size") in honoured  # role.tp
    assert (_key(RuntimeConfig), "log_level") in honoured  # run, raw = load_run_config()
    assert (_key(ParallelConfig), "use_tp_pp_dp_mapping") not in honoured


def test_every_accepted_key_is_honoured_or_has_a_declared_fate():
    sc = scan()
    honoured = sc.honoured()
    without_fate = []
    for (cls, name), f in accepted_fields().items():
        fate = fate_of(f)
        if not isinstance(fate, Honoured):
            continue
        if fate.via:
            owner, _, target = fate.via.partition(".")
            carrier = next(c for c in _containers() + [cls] if c.__name__ == owner)
            if (_key(carrier), target) not in honoured:
                without_fate.append(f"{cls.__name__}.{name}: via {fate.via}, which is unread")
            if (_key(cls), name) not in sc.inside:
                without_fate.append(f"{cls.__name__}.{name}: mindrl/config never reads it")
        elif (_key(cls), name) not in honoured:
            without_fate.append(f"{cls.__name__}.{name}")
    assert not without_fate, (
        "accepted but never read outside mindrl/config and no fate declared "
        "(spec(fate=handed/no_effect/refused(...)) or read it):\n  " + "\n  ".join(without_fate)
    )


def _honoured_elsewhere(fate: Any) -> bool:
    """Handed on one backend, honoured by mindrl's own code on the others."""
    return isinstance(fate, Handed) and bool(fate.elsewhere)


def test_a_key_handed_on_npu_and_honoured_elsewhere_is_read():
    honoured = scan().honoured()
    unread = [
        f"{cls.__name__}.{name}"
        for (cls, name), f in accepted_fields().items()
        if _honoured_elsewhere(fate_of(f)) and (_key(cls), name) not in honoured
    ]
    assert not unread, "handed with `elsewhere` but never read outside mindrl/config: " + str(
        unread
    )
    assert {("KernelConfig", "use_fused_rmsnorm"), ("KernelConfig", "use_fused_swiglu")} <= {
        (cls.__name__, name)
        for (cls, name), f in accepted_fields().items()
        if _honoured_elsewhere(fate_of(f))
    }


def test_declared_fates_are_not_contradicted_by_a_reader():
    """A key mindrl now reads must drop its no_effect / refused / handed fate."""
    honoured = scan().honoured()
    stale = [
        f"{cls.__name__}.{name}: {fate_of(f).kind}, but read outside mindrl/config"
        for (cls, name), f in accepted_fields().items()
        if not isinstance(fate_of(f), Honoured)
        and not _honoured_elsewhere(fate_of(f))
        and (_key(cls), name) in honoured
        and (cls.__name__, name) not in READ_DESPITE_FATE
    ]
    assert not stale, "\n".join(stale)


def test_fates_are_well_formed():
    for (cls, name), f in accepted_fields().items():
        fate = fate_of(f)
        where = f"{cls.__name__}.{name}"
        if isinstance(fate, (NoEffect, Refused)):
            assert fate.reason, where
        if isinstance(fate, Handed):
            assert fate.to and all(t in TARGETS for t in fate.to), where
        if isinstance(fate, Refused) and fate.allowed is not None:
            default = f.default if f.default is not dataclasses.MISSING else None
            assert default in fate.allowed, f"{where}: its default must be allowed"


def test_every_fate_is_one_of_the_four_kinds():
    kinds = {fate_of(f).kind for f in accepted_fields().values()}
    assert kinds == {"honoured", "handed", "no_effect", "refused"}


# -- the fates act ------------------------------------------------------------------------------


def _messages(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def test_a_no_effect_key_warns_exactly_once(fate_log):
    for _ in range(2):
        load_run_config(BASE, ["rl_config.zmq_communication=false"], check_paths=False)
    got = _messages(fate_log, "zmq_communication")
    assert len(got) == 1, got
    assert got[0].startswith("rl_config.zmq_communication: false has no effect in mindrl: ")
    assert "TransferDock" in got[0]


def test_a_no_effect_key_at_its_default_is_silent(fate_log):
    load_run_config(BASE, ["rl_config.zmq_communication=true"], check_paths=False)
    assert not _messages(fate_log, "zmq_communication")


def test_the_host_heap_threshold_warns_on_a_device_and_acts_on_cpu(fate_log):
    for acc in ("cpu", "npu"):
        load_run_config(
            BASE,
            [f"runtime.accelerator={acc}", "runtime.release_memory_min_mb=64"],
            check_paths=False,
        )
    got = _messages(fate_log, "release_memory_min_mb")
    assert got == [
        "runtime.release_memory_min_mb has no effect on npu: it keeps a small free host heap "
        "between passes on cpu; a device's cached blocks are always given back"
    ]
    reset_warnings()
    fate_log.clear()
    load_run_config(BASE, ["runtime.accelerator=npu"], check_paths=False)  # the default
    assert not _messages(fate_log, "release_memory_min_mb")


def test_a_dashed_key_is_read_as_mindspeed_does():
    """`min-lr` is `min_lr` (MindSpeed-RL's BaseConfig.update); a later section still wins."""
    run, raw = load_run_config(BASE, ["++megatron_training.adam-eps=1e-7"], check_paths=False)
    assert run.actor.optim.adam_eps == 1e-7
    run, raw = load_run_config(BASE, ["++megatron_training.min-lr=1e-9"], check_paths=False)
    assert run.actor.optim.min_lr == raw["actor_config"]["min_lr"] != 1e-9


REFUSED = [
    ("rl_config.share_backbone=true", "the shared backbone can only be used with LoRA"),
    ("rl_config.tp_split_expert=true", "expert-parallel rollout): not built yet"),
    ("generate_config.infer_pipeline_parallel_size=2", "pipeline-parallel rollout"),
    (
        "megatron_training.context_parallel_algo=kvallgather_cp_algo",
        "MindSpeed's context parallel algorithms are ulysses_cp_algo, megatron_cp_algo and",
    ),
    ("megatron_training.lora_target_modules=[linear_q]", "not megatron linears mindrl adapts"),
    ("megatron_training.stage=ray_foo", "mindrl trains GRPO, DAPO, PPO and offline DPO"),
    ("megatron_training.stage=ray_online_dpo", "online DPO (stage ray_online_dpo): not built"),
    ("megatron_training.optimizer=sgd", "only the Adam optimizer is built"),
    ("megatron_training.split='90,10,0'", "train / valid / test split"),
    ("actor_config.rope_scaling_type=yarn", "yarn is built with multi_latent_attention"),
    ("actor_config.q_lora_rank=512", "set without multi_latent_attention: true"),
]


@pytest.mark.parametrize(("override", "reason"), REFUSED, ids=[o for o, _ in REFUSED])
def test_a_refused_key_is_a_config_error_naming_the_feature(override, reason):
    key = override.split("=")[0].removesuffix(".num_npus")
    with pytest.raises(ConfigError) as info:
        load_run_config(BASE, [f"++{override}"], check_paths=False)
    message = str(info.value)
    assert reason in message and f"{key.split('.', 1)[1]}: " in message, message


@pytest.mark.parametrize(
    "override",
    [
        "megatron_training.stage=ray_grpo",
        "megatron_training.stage=ray_dapo",
        "megatron_training.context_parallel_size=1",
        "megatron_training.context_parallel_algo=megatron_cp_algo",
        "rl_config.partial_rollout_max_split=1",
        "megatron_training.optimizer=adam",
        "rl_config.token_level_loss=true",
    ],
)
def test_a_refused_key_at_its_default_or_allowed_value_is_accepted(override):
    load_run_config(BASE, [f"++{override}"], check_paths=False)


def test_refusals_of_model_keys_name_their_feature():
    """Role keys through the builder itself (build.py's model-family check may refuse some of
    them first when they reach it from a model file)."""
    base = {
        "num_layers": 2,
        "hidden_size": 8,
        "ffn_hidden_size": 16,
        "num_attention_heads": 2,
        "vocab_size": 32,
        "max_position_embeddings": 64,
    }
    cases = {
        "normalization": ("LayerNorm", "only RMSNorm is built"),
        "position_embedding_type": ("learned_absolute", "only rotary position embeddings"),
        "use_mcore_models": (False, "legacy (non-mcore) models"),
        "spec": ("mindspeed_llm.tasks.models.spec.qwen3_spec layer_spec", "custom layer specs"),
    }
    for key, (value, reason) in cases.items():
        problems = _Problems()
        build_groups(ROLE_GROUPS, {**base, key: value}, "actor_config", problems)
        assert any(p.startswith(f"actor_config.{key}: ") and reason in p for p in problems.items), (
            key,
            problems.items,
        )


def test_a_handed_key_is_handed_on_its_backend_and_warned_elsewhere(fate_log):
    run, _ = load_run_config(
        BASE,
        [
            "++megatron_training.use_flash_attn=true",
            "++rl_config.hccl_buffersize=512",
            # MindSpeed's fused kernels (honoured on CPU by mindrl's own: test_host_fusions.py)
            "megatron_training.use_fused_rmsnorm=false",
            "megatron_training.use_fused_swiglu=false",
            "megatron_training.use_fused_rotary_pos_emb=false",
        ],
        check_paths=False,
    )
    npu = handoffs(run, "npu")
    assert npu.to(MINDSPEED)["use_flash_attn"] is True
    assert npu.to(MINDSPEED)["shape_order"] == "SBH"  # handed at its default value too
    assert npu.env()["HCCL_BUFFSIZE"] == "512"
    assert npu.to(VLLM_ASCEND) == {"ascend_scheduler_config_enabled": True}
    assert not _messages(fate_log, "use_flash_attn")

    for _ in range(2):
        cpu = handoffs(run, "cpu")
    assert cpu.values == {} and cpu.env() == {}
    got = _messages(fate_log, "use_flash_attn")
    assert got == [
        "actor_config.use_flash_attn: true has no effect on cpu: handed to MindSpeed's "
        "megatron adaptor on npu"
    ]
    assert _messages(fate_log, "hccl_buffersize")  # 512 is not the default
    assert not _messages(fate_log, "shape_order")  # SBH is


def test_a_mindspeed_section_mindrl_has_no_group_for_warns_once(fate_log):
    assert section_fate("msprobe_config", {"msprobe": False}) is None
    assert section_fate("msprobe_config", {}) is None  # empty: nothing to warn about
    assert section_fate("msprobe_config", {"msprobe": True}) is None
    assert section_fate("msprobe_config", {"msprobe": True}) is None
    assert len(_messages(fate_log, "msprobe_config")) == 1
    assert "msprobe accuracy dumps are not built" in _messages(fate_log, "msprobe_config")[0]


def test_handoffs_of_one_role_name_its_keys():
    run, _ = load_run_config(BASE, ["++actor_config.use_flash_attn=true"], check_paths=False)
    assert handoffs(run.actor, "npu").to(MINDSPEED)["use_flash_attn"] is True


# -- a MindSpeed-RL config with every key ---------------------------------------------------------

# MindSpeed-RL's config classes with their defaults (HEAD 05a90d7, /tmp/ms_audit/keys.md).
# Defaults written in code there: initial_loss_scale 2 ** 32, n_samples_per_prompt 1,
# *_max_packing_token_size = max_packing_token_size (4096), *_dynamic_max_batch_size None.
MEGATRON_DEFAULTS: dict[str, Any] = {
    "use_mcore_models": False,
    "spec": None,
    "sequence_parallel": False,
    "use_flash_attn": False,
    "use_rotary_position_embeddings": False,
    "use_fused_rmsnorm": False,
    "use_fused_swiglu": False,
    "shape_order": "SBH",
    "no_bias_dropout_fusion": False,
    "rope_scaling_type": None,
    "rope_scaling_factor": 1.0,
    "low_freq_factor": None,
    "high_freq_factor": None,
    "original_max_position_embeddings": None,
    "max_position_embeddings": None,
    "beta_fast": 32,
    "beta_slow": 1,
    "rope_scaling_mscale": 1.0,
    "rope_scaling_mscale_all_dim": 0.0,
    "rope_scaling_original_max_position_embeddings": None,
    "num_layers": None,
    "hidden_size": None,
    "ffn_hidden_size": None,
    "num_attention_heads": None,
    "kv_channels": None,
    "group_query_attention": False,
    "num_query_groups": 1,
    "untie_embeddings_and_output_weights": False,
    "multi_latent_attention": False,
    "qk_pos_emb_head_dim": None,
    "qk_head_dim": None,
    "q_lora_rank": None,
    "kv_lora_rank": None,
    "v_head_dim": None,
    "qk_layernorm": False,
    "moe_grouped_gemm": False,
    "moe_permutation_async_comm": False,
    "moe_tp_extend_ep": False,
    "moe_alltoall_overlap_comm": False,
    "use_fused_moe_token_permute_and_unpermute": False,
    "moe_token_dispatcher_type": None,
    "seq_aux": False,
    "first_k_dense_replace": None,
    "moe_layer_freq": None,
    "moe_router_topk": 2,
    "num_experts": None,
    "n_shared_experts": None,
    "moe_ffn_hidden_size": None,
    "moe_router_load_balancing_type": "aux_loss",
    "moe_router_num_groups": None,
    "moe_router_group_topk": None,
    "moe_router_topk_scaling_factor": None,
    "norm_topk_prob": False,
    "moe_router_score_function": "softmax",
    "moe_router_enable_expert_bias": False,
    "log_throughput": False,
    "make_vocab_size_divisible_by": 128,
    "padded_vocab_size": None,
    "add_qkv_bias": False,
    "disable_bias_linear": False,
    "attention_dropout": 0.1,
    "init_method_std": 0.02,
    "hidden_dropout": 0.1,
    "position_embedding_type": "learned_absolute",
    "rotary_base": 10000,
    "normalization": "LayerNorm",
    "norm_epsilon": 1e-05,
    "swiglu": False,
    "no_masked_softmax_fusion": False,
    "attention_softmax_in_fp32": False,
    "no_gradient_accumulation_fusion": False,
    "bf16": True,
    "use_distributed_optimizer": False,
    "global_batch_size": None,
    "seq_length": None,
    "tokenizer_type": None,
    "tokenizer_name_or_path": None,
    "train_iters": None,
    "eval_iters": 100,
    "distributed_backend": "nccl",
    "no_shared_storage": False,
    "save_interval": None,
    "no_load_optim": None,
    "no_load_rng": None,
    "no_save_optim": None,
    "no_save_rng": None,
    "is_instruction_dataset": False,
    "is_pairwise_dataset": False,
    "variable_seq_lengths": False,
    "no_pad_to_seq_lengths": False,
    "no_shuffle": False,
    "stage": None,
    "micro_batch_size": None,
    "tensor_model_parallel_size": 1,
    "pipeline_model_parallel_size": 1,
    "expert_model_parallel_size": 1,
    "num_layers_per_virtual_pipeline_stage": None,
    "lr": None,
    "lr_decay_style": "linear",
    "min_lr": 0.0,
    "weight_decay": 0.01,
    "lr_warmup_fraction": None,
    "clip_grad": 1.0,
    "adam_beta1": 0.9,
    "adam_beta2": 0.999,
    "initial_loss_scale": 4294967296,
    "finetune": False,
    "load": None,
    "save": None,
    "pad_to_multiple_of": 8,
    "data_path": None,
    "split": None,
    "dataloader_type": None,
    "enable_high_availability": False,
    "context_parallel_size": 1,
    "context_parallel_algo": "ulysses_cp_algo",
    "reset_position_ids": False,
    "optimizer": "adam",
    "do_sample": False,
    "use_kv_cache": False,
    "use_tp_pp_dp_mapping": False,
    "log_interval": 100,
    "load_checkpoint_loosely": False,
    "prompt_type": None,
    "prompt_type_path": None,
    "tokenizer_not_use_fast": False,
    "use_fused_rotary_pos_emb": False,
    "full_shuffle_instruction_dataset": False,
    "tokenizer_padding_side": "right",
    "num_workers": 2,
    "skip_train": False,
    "eval_interval": 1000,
    "seed": 1234,
    "vocab_extra_ids": 0,
    "algorithm": None,
    "ddp_bucket_size": None,
    "no_check_for_nan_in_loss_and_grad": False,
    "overlap_grad_reduce": False,
    "accumulate_allreduce_grads_in_fp32": False,
    "pretrained_checkpoint": None,
    "reuse_fp32_param": False,
    "recompute_granularity": None,
    "recompute_method": None,
    "recompute_num_layers": None,
    "num_layer_list": None,
    "dataset_additional_keys": [],
    "npu_deterministic": False,
    "overlap_param_gather": False,
    "recompute_activation_function": False,
    "swap_attention": False,
    "ai_framework": None,
    "noop_layers": None,
    "attention_mask_type": "causal",
    "reset_attention_mask": False,
    "use_cp_send_recv_overlap": False,
    "use_fused_ring_attention_update": False,
    "dpo_loss_type": "sigmoid",
    "ref_model": "",
    "refer_model_iter": 1,
    "use_ascend_coc": False,
    "coc_mode": -1,
    "coc_parallel_num": 1,
    "coc_fused_kernel": False,
    "swap_optimizer": False,
    "mm_model": None,
    "attention_bias": False,
    "moe_aux_loss_coeff": 0.001,
    "gemm_gradient_accumulation_fusion": False,
    "lora_ckpt_filter": False,
    "lora_r": 8,
    "lora_alpha": 16,
    "lora_fusion": False,
    "lora_target_modules": None,
    "transformer_impl": "local",
}
RL_DEFAULTS: dict[str, Any] = {
    "runtime_env_path": "configs/envs/runtime_env.yaml",
    "hccl_buffersize": 256,
    "rule_reward": True,
    "beta": 0.1,
    "actor_resource": {"num_npus": None},
    "reference_resource": None,
    "reward_resource": None,
    "critic_resource": None,
    "vit_resource": None,
    "num_samples_per_step": 1,
    "max_prompt_length": 512,
    "epochs": 1,
    "clip_ratio": 0.2,
    "cliprange_value": 0.5,
    "entropy_coeff": 0.0,
    "gamma": 1.0,
    "lam": 0.95,
    "advantage_whiten": True,
    "kl_penalty": "low_var_kl",
    "kl_ctrl_type": "fixed",
    "init_kl_coef": 0.01,
    "kl_horizon": 1000,
    "kl_target": 100.0,
    "adv_estimator": "group_norm",
    "verifier_function": ["base_acc"],
    "verifier_weight": [1.0],
    "verifier_parallel": 1,
    "verifier_timeout": 30,
    "integrated_mode_config": None,
    "use_kl_in_reward": False,
    "shuffle_mini_batch": False,
    "tp_split_expert": False,
    "use_tensorboard": False,
    "use_wandb": False,
    "wandb_project": "",
    "wandb_exp_name": "",
    "wandb_save_dir": "",
    "use_swanlab": False,
    "swanlab_mode": "",
    "swanlab_project": "",
    "swanlab_exp_name": "",
    "swanlab_save_dir": "",
    "blocking": True,
    "async_engine": False,
    "guarantee_order": False,
    "num_cpus_for_local_task": 1,
    "num_cpus_for_placement_group": 8,
    "use_integrated_worker": True,
    "use_dp_batch_balance": False,
    "ref_forward_micro_batch_size": None,
    "actor_forward_micro_batch_size": None,
    "vit_forward_micro_batch_size": None,
    "actor_rollout_dispatch_size": None,
    "actor_logprob_dispatch_size": None,
    "ref_dispatch_size": None,
    "reward_dispatch_size": None,
    "dynamic_sampling_dispatch_size": None,
    "adv_dispatch_size": None,
    "actor_update_dispatch_size": None,
    "critic_update_dispatch_size": None,
    "critic_value_dispatch_size": None,
    "kl_dispatch_size": None,
    "actor_image_embeds_dispatch_size": None,
    "is_multimodal": False,
    "use_remove_padding": False,
    "reuse_image_embeds": False,
    "colocate_actor_and_vit": False,
    "n_samples_per_prompt": 1,
    "mini_batch_size": 1,
    "use_dynamic_bsz": False,
    "max_packing_token_size": 4096,
    "ref_max_packing_token_size": 4096,
    "actor_max_packing_token_size": 4096,
    "update_max_packing_token_size": 4096,
    "dynamic_max_batch_size": None,
    "ref_dynamic_max_batch_size": None,
    "actor_dynamic_max_batch_size": None,
    "update_dynamic_max_batch_size": None,
    "log_max_throughput": True,
    "token_level_loss": True,
    "data_strategy": "td",
    "transfer_queue_data_shard_num": 1,
    "transfer_queue_data_shard_port_base": None,
    "clip_higher_enable": False,
    "clip_ratio_low": 0.1,
    "clip_ratio_high": 0.1,
    "overlong_buffer_enable": False,
    "overlong_buffer": 0,
    "overlong_buffer_penalty_factor": 1.0,
    "rollout_max_tokens": 2048,
    "filter_groups_enable": False,
    "filter_groups_metric": "acc",
    "filter_groups_max_batches": 1,
    "filter_groups_train_batch_size": 1,
    "zmq_communication": True,
    "partial_rollout_max_split": 1,
    "require_max_age_all_finished": True,
    "multi_turn_enable": False,
    "tool_config_path": None,
    "max_tool_calls": 0,
    "max_parallel_calls": 0,
    "max_total_response_length": 0,
    "max_tool_response_length": 0,
    "tool_response_truncate_side": None,
    "tool_parser_format": None,
    "share_backbone": False,
}
# seed-era (MindSpeed-RL before 2025-05-13) rl_config keys
SEED_RL_DEFAULTS: dict[str, Any] = {
    "experience_count": 1,
    "experience_count_actor": None,
    "experience_count_ref": None,
    "experience_count_reward": None,
    "experience_count_rule_reward": None,
    "enable_sharding_validate": False,
    "update_micro_batch_size": None,
}
GENERATE_DEFAULTS: dict[str, Any] = {
    "limit_mm_image_per_prompt": 1,
    "limit_mm_video_per_prompt": 0,
    "data_parallel_size": None,
    "tokenizer_name_or_path": "/path/to/tokenizer",
    "trust_remote_code": False,
    "eplb_token_collects": False,
    "eplb_token_save_path": "./",
    "expert_map_path": None,
    "infer_tensor_parallel_size": 8,
    "infer_pipeline_parallel_size": 1,
    "infer_expert_parallel_size": 1,
    "max_num_seqs": 1,
    "max_model_len": 2048,
    "max_num_batched_tokens": 2048,
    "dtype": "bfloat16",
    "gpu_memory_utilization": 0.5,
    "offload_train_optimizer": False,
    "offload_train_grad": False,
    "offload_train_param": False,
    "enable_prefix_caching": False,
    "num_scheduler_steps": 1,
    "enforce_eager": True,
    "torchair_graph": False,
    "enable_expert_parallel": False,
    "ascend_scheduler_config_enabled": True,
}
SAMPLING_DEFAULTS: dict[str, Any] = {
    "logprobs": 1,
    "max_tokens": 128,
    "top_p": 1.0,
    "top_k": 50,
    "min_p": 0.0,
    "temperature": 0.2,
    "detokenize": False,
    "seed": None,
}


def _accepts_none(groups: dict[str, type] | type, key: str) -> bool:
    classes = groups.values() if isinstance(groups, dict) else [groups]
    for cls in classes:
        aliases = {
            a: f.name for f in dataclasses.fields(cls) for a in f.metadata.get("aliases", ())
        }
        name = aliases.get(key, key)
        hints = typing.get_type_hints(cls)
        if name in hints:
            return type(None) in typing.get_args(hints[name])
    raise AssertionError(f"{key}: not a key of {classes}")


def _with_defaults(section: dict, defaults: dict[str, Any], groups: dict[str, type] | type):
    """`section` plus every MindSpeed-RL key it lacks, at MindSpeed-RL's default. A None
    default is MindSpeed-RL's "unset" (its argument parser skips None), so it is only written
    where the mindrl field takes None."""
    out = dict(section)
    for key, value in defaults.items():
        if key not in out and (value is not None or _accepts_none(groups, key)):
            out[key] = value
    return out


def test_every_mindspeed_rl_key_is_a_mindrl_key():
    role_keys = {k for cls in ROLE_GROUPS.values() for k in field_names(cls)}
    rl_keys = {k for cls in RL_GROUPS.values() for k in field_names(cls)}
    missing = sorted(set(MEGATRON_DEFAULTS) - role_keys)
    missing += sorted(set(RL_DEFAULTS) - rl_keys) + sorted(set(SEED_RL_DEFAULTS) - rl_keys)
    missing += sorted(set(GENERATE_DEFAULTS) - set(field_names(GenerateConfig)))
    missing += sorted(set(SAMPLING_DEFAULTS) - set(field_names(SamplingConfig)))
    assert not missing


def _every_key_config(skip: tuple[str, ...] = ()) -> dict:
    """The shipped MindSpeed-RL-style config plus every other MindSpeed-RL key at its default."""
    raw = compose_raw(BASE)
    # a key the model file or a role section sets keeps its value (megatron_training would
    # override the model file's)
    present = {k for model in raw["model"].values() for k in model}
    present |= {
        k for s in ("actor_config", "ref_config", "reward_config") for k in raw.get(s) or {}
    }
    megatron = {k: v for k, v in MEGATRON_DEFAULTS.items() if k not in skip and k not in present}
    raw["megatron_training"] = _with_defaults(raw["megatron_training"], megatron, ROLE_GROUPS)
    # the base is the seed's 1.x config: 1.x's default (2.x's is true) before the rest
    raw["rl_config"].setdefault("use_integrated_worker", False)
    rl = _with_defaults(raw["rl_config"], {**RL_DEFAULTS, **SEED_RL_DEFAULTS}, RL_GROUPS)
    # values the shipped config needs and MindSpeed-RL would spell the same way
    rl.pop("actor_resource")
    rl["actor_resource"] = raw["rl_config"]["actor_resource"]
    raw["rl_config"] = rl
    gen = _with_defaults(raw["generate_config"], GENERATE_DEFAULTS, GenerateConfig)
    gen["sampling_config"] = _with_defaults(
        gen.get("sampling_config", {}), SAMPLING_DEFAULTS, SamplingConfig
    )
    raw["generate_config"] = gen
    return raw


def test_mindspeed_moe_defaults_spelled_out_are_not_an_moe_model():
    build_run_config(_every_key_config(skip=()), BASE)


def test_a_config_with_every_mindspeed_rl_key_builds_with_only_declared_warnings(fate_log):
    """It builds; what it logs are fate warnings, each about a key with a declared fate."""
    build_run_config(_every_key_config(), BASE)
    logged = [r.getMessage() for r in fate_log.records]
    assert len(logged) == len(warned()), logged  # nothing but fate warnings
    fates = {f"{cls.__name__}.{name}": fate_of(f) for (cls, name), f in accepted_fields().items()}
    for key in warned():
        assert isinstance(fates[key], NoEffect), key
