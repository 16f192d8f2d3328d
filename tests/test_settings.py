"""eagle3build.config.settings: the stages' settings objects, their config fields made from the key table, and no
default of a declared key restated outside the declarations (issue 59 item 3), anywhere in the package."""
from __future__ import annotations

import ast
import dataclasses
import importlib
from pathlib import Path

import pytest
from smk import REPO
from test_layers import FLOOR_ORDER

from eagle3build.capture.capture_hidden_states import CaptureSettings
from eagle3build.config import settings as st
from eagle3build.config import spec as cs
from eagle3build.data.prepare_data import PrepareSettings
from eagle3build.serve.benchmark import BenchmarkSettings
from eagle3build.train.trainer import TrainConfig
from eagle3build.workflow.contract import CONTRACTS, RULE_ENTRIES, STAGE_GROUPS, job_settings


def attribute(name: str):
    """The object of a ``module:attribute`` string (a contract's ``entry`` or ``settings``)."""
    module, attr = name.split(":")
    return getattr(importlib.import_module(module), attr)


# The stage whose job settings (``contract.StageSettings``) a rule that is no stage runs with (rules/compat_report.smk:
# compat_markdown's ``settings`` param is compat_report's).
RULE_STAGES = {"compat_markdown": "compat_report"}
# Each settings object of a stage and the stage whose settings fill its config fields: the one each stage's contract
# names (13), the rules' of RULE_ENTRIES, and train_draft's section object TrainConfig.
SETTINGS = {**{attribute(c.settings): stage for stage, c in CONTRACTS.items()},
            **{attribute(e.settings): RULE_STAGES[rule] for rule, e in RULE_ENTRIES.items()},
            TrainConfig: "train_draft"}
STAGE_DIRS = sorted({REPO / "eagle3build" / g for g in STAGE_GROUPS.values()})
MODULES = sorted((REPO / "eagle3build").rglob("*.py"))  # every module of the package
# The defaults that may equal a declared key's: (module, function, parameter) -> why it is no copy. Only the floor
# below ``config`` (tests/test_layers.py FLOOR_ORDER), which cannot read the declarations (``settings.declared``);
# anywhere else such a default is ``declared(path)``, or none (the caller passes the value).
ALLOWED = {
    # Never run a target's own code unless asked: the loader's safe stance for every caller (tests, probes,
    # benchmarks), not a copy of target.trust_remote_code's default; each stage passes the key's value.
    ("eagle3build.target", "load_config", "trust_remote_code"): "safety: no remote code unless asked",
    ("eagle3build.target", "load_model", "trust_remote_code"): "safety: no remote code unless asked",
    # A draft section is read key by key, each absent one at its default (choice.resolve: method, layer, options),
    # from draft/, below config: a section without compare_methods compares no other method.
    ("eagle3build.draft.choice", "compared", "compare_methods"): "a partial draft section: none compared",
}


def _module(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def generated_classes() -> dict[type, str]:
    """Every class of the stage subpackages made by ``config.settings`` (it has ``CONFIG_KEYS``) -> its module."""
    out = {}
    for d in STAGE_DIRS:
        for f in sorted(d.glob("*.py")):
            mod = importlib.import_module(_module(f))
            for obj in vars(mod).values():
                if isinstance(obj, type) and obj.__module__ == mod.__name__ and "CONFIG_KEYS" in vars(obj):
                    out[obj] = mod.__name__
    return out


def key_names() -> dict[str, list[cs.Key]]:
    """Name -> the keys a parameter or field of that name takes: each key's last part, and each config field's
    name in a settings object (``dtype``: target.serve_dtype, ``benchmark_sets``: benchmark.sets)."""
    out: dict[str, list[cs.Key]] = {}
    for k in cs.KEYS:
        out.setdefault(k.name, []).append(k)
    for cls in SETTINGS:
        for name, path in cls.CONFIG_KEYS.items():
            if cs.key(path) not in out.setdefault(name, []):
                out[name].append(cs.key(path))
    return out


def _definitions(tree: ast.AST, outer: str = ""):
    """Each function and class definition under ``tree`` with its qualified name (``HooksStates.__init__``;
    ``shard_dataset_class.ShardDataset.__init__`` for one defined inside a function)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{outer}.{node.name}" if outer else node.name
            yield name, node
            yield from _definitions(node, name)
        else:
            yield from _definitions(node, outer)


# Calls that read a value with a default in its place: ``opts.get("port", 8000)``, ``d.pop(k, v)``,
# ``getattr(o, k, v)``.
DEFAULTING_CALLS = ("get", "pop", "setdefault", "getattr")


def _defaulting_calls(tree: ast.AST, outer: str = ""):
    """``(where, name, default)`` of each call in ``tree`` that reads ``name`` (a string constant, its last dotted part)
    with a ``default`` in its place (``DEFAULTING_CALLS``), ``where`` the enclosing definition's qualified name (the
    module's top level: ``<module>``)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield from _defaulting_calls(node, f"{outer}.{node.name}" if outer else node.name)
            continue
        if isinstance(node, ast.Call):
            f, args = node.func, list(node.args)
            if isinstance(f, ast.Name) and f.id == "getattr" and len(args) == 3:
                args = args[1:]
            elif not (isinstance(f, ast.Attribute) and f.attr in DEFAULTING_CALLS[:3] and len(args) == 2):
                args = []
            if args and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str):
                yield outer or "<module>", args[0].value.rsplit(".", 1)[-1], args[1]
        yield from _defaulting_calls(node, outer)


def restated(source: str, names: dict[str, list[cs.Key]], functions: bool = True) -> list[str]:
    """The fields of classes (an annotated name with a value in a class body) and, with ``functions``, the keyword
    defaults of functions and the defaults of calls that read a value by name (``opts.get("port", 8000)``:
    ``DEFAULTING_CALLS``) in ``source`` whose name is one of ``names`` and whose literal default is the declared
    default of one of its keys (equal and of the same type; a None default, the absent value, is no copy):
    ``"where(name=value): key"``, ``where`` the definition's qualified name."""
    found = []
    tree = ast.parse(source)
    calls = [(where, name, default) for where, name, default in _defaulting_calls(tree)] if functions else []
    for where, name, default in calls:
        try:
            value = ast.literal_eval(default)
        except ValueError:
            continue
        for k in names.get(name, []):
            if value is not None and value == k.default and type(value) is type(k.default):
                found.append(f"{where}({name}={value!r}): {k.path}")
    for where, node in _definitions(tree):
        pairs = []
        if functions and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            pos = a.posonlyargs + a.args
            pairs += list(zip(pos[len(pos) - len(a.defaults):], a.defaults, strict=True))
            pairs += [(x, d) for x, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None]
            pairs = [(x.arg, d) for x, d in pairs]
        elif isinstance(node, ast.ClassDef):
            pairs = [(s.target.id, s.value) for s in node.body
                     if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.value is not None]
        for name, default in pairs:
            try:
                value = ast.literal_eval(default)
            except ValueError:
                continue  # not a literal: declared(...), a computed default
            for k in names.get(name, []):
                if value == k.default and type(value) is type(k.default):
                    found.append(f"{where}({name}={value!r}): {k.path}")
    return found


def restated_in_package() -> dict[tuple[str, str, str], list[str]]:
    """Every restated default of the package's modules (``restated``): (module, definition, name) -> its keys."""
    names = key_names()
    out: dict[tuple[str, str, str], list[str]] = {}
    for f in MODULES:
        for hit in restated(f.read_text(), names):
            head, path = hit.rsplit(": ", 1)
            where, rest = head.split("(", 1)
            out.setdefault((_module(f), where, rest.split("=", 1)[0]), []).append(path)
    return out


def test_the_settings_objects_are_generated_from_the_key_table():
    """Every stage takes one settings object made by config.settings (its contract names it), and no other class of
    the stages is made so."""
    assert set(generated_classes()) == set(SETTINGS)
    assert len({SETTINGS[attribute(c.settings)] for c in CONTRACTS.values()}) == len(CONTRACTS) == 13


@pytest.mark.parametrize("cls", list(SETTINGS), ids=lambda c: c.__name__)
def test_config_fields_hold_the_declared_defaults_and_the_stage_settings(cls):
    """A config field's default is its key's declared default (config.yaml's value: benchmark.sets' [chat, humaneval],
    not the ["chat"] BenchmarkSettings once restated), its type the key's, its choices checked; every key is a
    setting of the class's stage, so ``from_settings`` fills it from a job's settings."""
    config = cs.defaults()
    for name, path in cls.CONFIG_KEYS.items():
        k = cs.key(path)
        assert st.default_of(cls, name) == k.default, (cls, name)
        field = next(f for f in dataclasses.fields(cls) if f.name == name)
        assert field.kw_only and field.type == k.python_type(), (cls, name)
        assert f"``{name}`` (``{path}``, default ``{k.default!r}``): {k.doc}" in cls.__doc__
    stage = CONTRACTS[SETTINGS[cls]]
    assert set(cls.CONFIG_KEYS.values()) <= set(stage.triggers + stage.runtime), cls
    s = job_settings(stage.stage, config)
    values = {name: s[path] for name, path in cls.CONFIG_KEYS.items()}
    own = {f.name: f"<{f.name}>" for f in dataclasses.fields(cls)
           if f.name not in cls.CONFIG_KEYS and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    made = cls.from_settings(s, **own)
    assert {name: getattr(made, name) for name in cls.CONFIG_KEYS} == values
    for name, sub in cls.SECTIONS.items():  # TrainSettings' train: a TrainConfig of the same settings
        assert getattr(made, name) == sub.from_settings(s)
    for name in [*cls.CONFIG_KEYS, *cls.SECTIONS][:1]:
        with pytest.raises(TypeError):
            cls.from_settings(s, **own, **{name: None})


def test_the_benchmark_sets_default_is_the_configs():
    """Issue 59: BenchmarkSettings restated 9 defaults, sets=None meaning ["chat"] against the config's
    ["chat", "humaneval"]; the same drift in prepare_data's benchmark_sets and the capture's compute_dtype."""
    bench = BenchmarkSettings(target_dir="t", head_dir="h", prompts_path="p", out_json="o")
    assert bench.sets == ["chat", "humaneval", "mtbench"] == cs.key("benchmark.sets").default  # mtbench: issue 67
    assert (bench.max_model_len, bench.seed, bench.k_schedule_concurrencies) == (2048, 0, [])
    assert (bench.mtbench_per_category, bench.mtbench_turns) == (1, 1)
    assert bench.sets is not BenchmarkSettings(target_dir="t", head_dir="h", prompts_path="p", out_json="o").sets
    prep = PrepareSettings(sources=[], target_dir="t", out_train="a", out_eval="b", out_prompts="c", out_report="d")
    assert prep.benchmark_sets == ["chat", "humaneval", "mtbench"]
    assert (prep.num_aux_layers, prep.require_eval) == (3, True)  # the default config's params (capture.*)
    cap = CaptureSettings(target_dir="t", tokens_path="x", out_path="y", start=0, count=1, aux_layer_ids=[1],
                          target_fingerprint="f", split="train")
    assert cap.compute_dtype == "bfloat16" == cs.key("capture.compute_dtype").default
    with pytest.raises(ValueError, match=r"target.serve_dtype 'fp8' is not one of \['float32', 'bfloat16'"):
        BenchmarkSettings(target_dir="t", head_dir="h", prompts_path="p", out_json="o", dtype="fp8")


def test_a_class_that_declares_a_config_field_itself_is_refused():
    with pytest.raises(TypeError, match="BenchmarkLike.seed is config key benchmark.seed's field"):
        @st.config_fields({"seed": "benchmark.seed"})
        class BenchmarkLike:
            seed: int = 0
    with pytest.raises(KeyError, match="'benchmark.seeds' is not a config key"):
        st.config_fields({"seed": "benchmark.seeds"})


def test_no_module_restates_a_declared_default():
    """No module of the package holds a literal that is a declared key's default under the key's name (or a settings
    object's field name): not as a class field (a settings class made by hand beside the generated ones:
    ``max_model_len: int = 2048``), not as a function's keyword default (``seed=0``). Such a default is
    ``declared(path)``, read from the key table, or none: the caller passes the job's value. ``ALLOWED`` lists the
    floor's few exceptions, each of which must still be found (drop an entry that no longer matches)."""
    found = restated_in_package()
    assert {where: keys for where, keys in found.items() if where not in ALLOWED} == {}
    assert set(ALLOWED) <= set(found), set(ALLOWED) - set(found)
    below_config = FLOOR_ORDER[:FLOOR_ORDER.index("config")]
    assert all(module.split(".")[1] in below_config for module, _, _ in ALLOWED)


def test_the_check_finds_a_restated_default():
    """The scan the test above runs: a hand-written settings class, keyword defaults and a call's default in place of a
    value read by name (``opts.get("port", 8000)``, issue 66: serve_check restated serve.port's) that copy declared
    defaults are found (also under a settings object's field name: ``dtype``; in a method, by its qualified name),
    other values, None and computed defaults are not."""
    source = (
        "class HandMade:\n    max_model_len: int = 2048\n    seed: int = 1\n    sets: list | None = None\n\n"
        "    def __init__(self, tokens_per_batch=4096):\n        pass\n\n"
        "def bench(x, seed=0, *, dtype='auto', trust_remote_code=declared('target.trust_remote_code'), top_p=1):\n"
        "    pass\n\n"
        "def check(opts, files):\n    port = int(opts.get('port', 8000))\n    opts.get('port', files['port'])\n"
        "    getattr(opts, 'served_name', None), opts.get('seed')\n    return opts.pop('serve.port', 8000)\n")
    assert restated(source, key_names()) == [
        "check(port=8000): serve.port", "check(port=8000): serve.port",
        "HandMade(max_model_len=2048): benchmark.max_model_len",
        "HandMade.__init__(tokens_per_batch=4096): capture.tokens_per_batch",
        "bench(seed=0): data.seed", "bench(seed=0): train.seed", "bench(seed=0): benchmark.seed",
        "bench(dtype='auto'): target.serve_dtype",
    ]
    assert restated(source, key_names(), functions=False) == ["HandMade(max_model_len=2048): benchmark.max_model_len"]
