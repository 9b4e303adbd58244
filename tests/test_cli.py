"""rlcore.config.cli: recipes by name or path, typed key=value overrides, exact one-line errors, JSON save."""
from __future__ import annotations

import json
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from rlcore.config import Config
from rlcore.config.cli import (BUILTIN_RECIPES, ConfigError, apply_overrides, available_recipes, config_to_dict,
                               did_you_mean, load_recipe, parse_argv, save_config)

# A recipe as a user writes one: its own algorithm dataclass and a reward function defined inline.
RECIPE = '''
from __future__ import annotations
from dataclasses import dataclass, field
from typing import Any, Literal
from rlcore.config import Config, RewardSpec


def exact(prompts, responses):
    return [1.0 for _ in responses]


@dataclass
class Algo:
    clip_low: float = 0.2
    epochs: int = 1
    normalize: bool = True
    loss_agg: Literal["token", "sequence"] = "token"
    kl_coef: float | None = None
    beta_schedule: list[float] = field(default_factory=lambda: [0.1, 0.2])
    clip_range: tuple[float, float] = (0.8, 1.2)
    extra: Any = 3
    hook: Any = None


def config() -> Config:
    cfg = Config(name=NAME)
    cfg.algorithm = Algo()
    cfg.rewards = [RewardSpec(fn=exact, weight=1.0)]
    return cfg
'''


def write_recipe(path, name="unit"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(RECIPE.replace("NAME", repr(name)))
    return path


@pytest.fixture
def recipes(tmp_path):
    write_recipe(tmp_path / "recipes" / "grpo.py", "grpo")
    write_recipe(tmp_path / "recipes" / "demo.py", "demo")
    (tmp_path / "recipes" / "_common.py").write_text("def config():\n    return None\n")
    return tmp_path / "recipes"


@pytest.fixture
def cfg(recipes):
    return load_recipe("grpo", recipes)


@contextmanager
def raises(expected: str):
    """pytest.raises for the exact message, which must be one line."""
    with pytest.raises(ConfigError, match=f"^{re.escape(expected)}$") as info:
        yield
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------------------------------------- recipes

def test_load_recipe_by_name(cfg):
    assert isinstance(cfg, Config)
    assert cfg.name == "grpo"
    assert type(cfg.algorithm).__name__ == "Algo"
    assert cfg.algorithm.clip_low == 0.2


def test_load_recipe_by_path_outside_recipes_dir(tmp_path, recipes):
    fork = write_recipe(tmp_path / "elsewhere" / "grpo.py", "fork")
    forked = load_recipe(str(fork), recipes)
    assert forked.name == "fork"
    # Same file name as recipes/grpo.py, but its own module: the two classes stay distinct.
    assert type(forked.algorithm) is not type(load_recipe("grpo", recipes).algorithm)


def test_unknown_recipe_suggests_closest(recipes):
    builtin = ", ".join(available_recipes(BUILTIN_RECIPES))
    with raises(f"unknown recipe 'grop'; did you mean 'grpo'? (available: demo, grpo; built in: {builtin})"):
        load_recipe("grop", recipes)
    with raises(f"unknown recipe 'zzz' (available: demo, grpo; built in: {builtin})"):
        load_recipe("zzz", recipes)
    with raises(f"unknown recipe '_common' (available: demo, grpo; built in: {builtin})"):  # helpers are not recipes
        load_recipe("_common", recipes)
    with raises(f"unknown recipe 'zzz' (available: {builtin})"):  # looking among the built-in ones only
        load_recipe("zzz")


def test_a_name_not_beside_the_caller_is_a_built_in_recipe(tmp_path):
    """A fork saved anywhere loads rlcore's own recipes by name: its folder first, then recipes/."""
    assert "demo" in available_recipes(BUILTIN_RECIPES) and not list(tmp_path.iterdir())
    assert load_recipe("demo", tmp_path).name == "demo" and load_recipe("demo").name == "demo"
    write_recipe(tmp_path / "demo.py", "my_demo")  # a recipe beside the caller wins over the built-in one
    assert load_recipe("demo", tmp_path).name == "my_demo"


def test_missing_recipe_file(tmp_path, recipes):
    missing = tmp_path / "nope.py"
    with raises(f"recipe file '{missing}' is not an existing .py file"):
        load_recipe(str(missing), recipes)


def test_recipe_without_config(tmp_path, recipes):
    path = tmp_path / "empty.py"
    path.write_text("x = 1\n")
    with raises(f"recipe '{path}' defines no config() function returning a Config"):
        load_recipe(str(path), recipes)


def test_recipe_config_not_a_dataclass(tmp_path, recipes):
    path = tmp_path / "bad.py"
    path.write_text("def config():\n    return {'lr': 1}\n")
    with raises(f"config() in '{path}' must return a dataclass instance such as "
                "rlcore.config.Config, got dict"):
        load_recipe(str(path), recipes)


# ---------------------------------------------------------------------------------------------- parsing

@pytest.mark.parametrize("override, get, expected", [
    ("train.steps=5", lambda c: c.train.steps, 5),
    ("optim.lr=1e-3", lambda c: c.optim.lr, 1e-3),
    ("optim.lr=3", lambda c: c.optim.lr, 3.0),
    ("model.activation_checkpointing=True", lambda c: c.model.activation_checkpointing, True),
    ("model.activation_checkpointing=yes", lambda c: c.model.activation_checkpointing, True),
    ("model.activation_checkpointing=1", lambda c: c.model.activation_checkpointing, True),
    ("rollout.sleep_while_training=FALSE", lambda c: c.rollout.sleep_while_training, False),
    ("rollout.sleep_while_training=no", lambda c: c.rollout.sleep_while_training, False),
    ("rollout.sleep_while_training=0", lambda c: c.rollout.sleep_while_training, False),
    ("name=my run=2", lambda c: c.name, "my run=2"),  # split at the first '=' only
    ("data.path=", lambda c: c.data.path, ""),
    ("algorithm.kl_coef=0.1", lambda c: c.algorithm.kl_coef, 0.1),
    ("algorithm.kl_coef=None", lambda c: c.algorithm.kl_coef, None),
    ("algorithm.kl_coef=null", lambda c: c.algorithm.kl_coef, None),
    ("optim.betas=[0.8,0.95]", lambda c: c.optim.betas, [0.8, 0.95]),
    ("optim.betas=0.8, 0.95", lambda c: c.optim.betas, [0.8, 0.95]),
    ("optim.betas=[]", lambda c: c.optim.betas, []),
    ("optim.betas.1=0.95", lambda c: c.optim.betas, [0.9, 0.95]),
    ("algorithm.beta_schedule=1,2,3", lambda c: c.algorithm.beta_schedule, [1.0, 2.0, 3.0]),
    ("algorithm.clip_range=0.7,1.3", lambda c: c.algorithm.clip_range, (0.7, 1.3)),
    ("algorithm.loss_agg=sequence", lambda c: c.algorithm.loss_agg, "sequence"),
    ("algorithm.clip_low=0.3", lambda c: c.algorithm.clip_low, 0.3),
    ("algorithm.normalize=false", lambda c: c.algorithm.normalize, False),
    ("algorithm.extra=4", lambda c: c.algorithm.extra, 4),  # Any holding an int: parsed as int
    ("rewards.0.weight=0.5", lambda c: c.rewards[0].weight, 0.5),
])
def test_override_parses_by_type(cfg, override, get, expected):
    apply_overrides(cfg, [override])
    value = get(cfg)
    assert value == expected
    assert type(value) is type(expected)
    if isinstance(value, list):
        assert [type(v) for v in value] == [type(v) for v in expected]


@pytest.mark.parametrize("override, message", [
    ("train.steps=1.5", "config key 'train.steps' expects int, got '1.5'"),
    ("rollout.load_lag_steps=soon", "config key 'rollout.load_lag_steps' expects int or one of auto, got 'soon'"),
    ("optim.lr=abc", "config key 'optim.lr' expects float, got 'abc'"),
    ("model.activation_checkpointing=maybe",
     "config key 'model.activation_checkpointing' expects bool, got 'maybe'"),
    ("algorithm.kl_coef=abc", "config key 'algorithm.kl_coef' expects float | None, got 'abc'"),
    ("optim.betas=[0.9,x]", "config key 'optim.betas' expects list[float], got '[0.9,x]'"),
    ("algorithm.clip_range=1", "config key 'algorithm.clip_range' expects tuple[float, float], got '1'"),
    ("algorithm.loss_agg=tok", "config key 'algorithm.loss_agg' expects one of token, sequence, got 'tok'"),
    ("algorithm.extra=4.5", "config key 'algorithm.extra' expects int, got '4.5'"),
    ("optim.lr=a\nb", "config key 'optim.lr' expects float, got 'a\\nb'"),  # stays one line
    ("algorithm.hook=x", "config key 'algorithm.hook' holds None, which only the recipe can set"),
    ("rewards.0.fn=m:f", "config key 'rewards.0.fn' holds function, which only the recipe can set"),
    ("optim.lrr=1", "unknown config key 'optim.lrr'; did you mean 'optim.lr'?"),
    ("sed=1", "unknown config key 'sed'; did you mean 'seed'?"),
    ("algorithm.clip_lo=1", "unknown config key 'algorithm.clip_lo'; did you mean 'algorithm.clip_low'?"),
    ("optim.zzzzzz=1", "unknown config key 'optim.zzzzzz'; valid keys: lr, weight_decay, betas, eps, "
                       "warmup_steps, schedule, min_lr_ratio, max_grad_norm"),
    ("optim.lr.x=1", "config key 'optim.lr.x': 'optim.lr' is a float, it has no sub-keys"),
    ("rewards.3.weight=1", "config key 'rewards.3': 'rewards' is a list of 1 items, valid indices 0..0"),
    ("rewards.w.weight=1", "config key 'rewards.w': 'rewards' is a list of 1 items, valid indices 0..0"),
    ("model=3", "config key 'model' is a section, not a value; set one of: model.path, model.dtype, "
                "model.mixed_precision, model.activation_checkpointing, model.attn_implementation, "
                "model.offload_frozen"),
    ("rewards.0=3", "config key 'rewards.0' is a section, not a value; set one of: rewards.0.fn, "
                    "rewards.0.model, rewards.0.weight"),
    ("rewards=[]", "config key 'rewards' is a list of sections, set in the recipe only; "
                   "override one item's field instead, e.g. rewards.0.<field>=..."),
    ("optim.lr", "expected key=value (e.g. optim.lr=1e-5), got 'optim.lr'"),
    ("=3", "expected key=value (e.g. optim.lr=1e-5), got '=3'"),
])
def test_override_errors(cfg, override, message):
    with raises(message):
        apply_overrides(cfg, [override])


def test_algorithm_section_cannot_be_replaced(cfg):
    with raises("config key 'algorithm' is a section, not a value; set one of: algorithm.clip_low, "
                "algorithm.epochs, algorithm.normalize, algorithm.loss_agg, algorithm.kl_coef, "
                "algorithm.beta_schedule, algorithm.clip_range, algorithm.extra, algorithm.hook"):
        apply_overrides(cfg, ["algorithm=grpo"])


def test_rewards_recipe_only_even_when_empty():
    with raises("config key 'rewards' is a list of sections, set in the recipe only; "
                "override one item's field instead, e.g. rewards.0.<field>=..."):
        apply_overrides(Config(), ["rewards=a:b"])
    with raises("config key 'rewards.0': 'rewards' is a list of 0 items, it is empty"):
        apply_overrides(Config(), ["rewards.0.weight=1"])


def test_overrides_apply_in_order_in_place(cfg):
    assert apply_overrides(cfg, ["optim.lr=1", "optim.lr=2"]) is cfg
    assert cfg.optim.lr == 2.0


@dataclass(frozen=True)
class Frozen:
    clip: float = 0.2


@dataclass
class Unresolvable:
    steps: NotDefinedAnywhere = 1  # noqa: F821 -- annotation never resolves: typed by the value


@dataclass
class WithPath:
    out: Path = Path("x")


def test_frozen_unresolvable_and_untyped_algorithms():
    cfg = apply_overrides(Config(algorithm=Frozen()), ["algorithm.clip=0.5"])
    assert cfg.algorithm.clip == 0.5
    cfg = apply_overrides(Config(algorithm=Unresolvable()), ["algorithm.steps=7"])
    assert cfg.algorithm.steps == 7
    with raises("config key 'algorithm.steps' expects int, got '0.5'"):
        apply_overrides(cfg, ["algorithm.steps=0.5"])
    with raises("config key 'algorithm.out' has type Path, which only the recipe can set"):
        apply_overrides(Config(algorithm=WithPath()), ["algorithm.out=y"])


# ---------------------------------------------------------------------------------------------- argv

def test_parse_argv_recipe_anywhere(recipes):
    cfg = parse_argv(["optim.lr=1e-4", "recipe=grpo", "train.steps=3", "optim.lr=2e-4"], recipes)
    assert (cfg.name, cfg.optim.lr, cfg.train.steps) == ("grpo", 2e-4, 3)


def test_parse_argv_recipe_path(tmp_path, recipes):
    fork = write_recipe(tmp_path / "forks" / "mine.py", "mine")
    assert parse_argv([f"recipe={fork}", "seed=4"], recipes).seed == 4


def test_parse_argv_needs_exactly_one_recipe(recipes):
    with raises("recipe=NAME is required exactly once (missing); available: demo, grpo"):
        parse_argv(["optim.lr=1"], recipes)
    with raises("recipe=NAME is required exactly once (given 2 times); available: demo, grpo"):
        parse_argv(["recipe=grpo", "recipe=demo"], recipes)


# ---------------------------------------------------------------------------------------------- saving

def test_config_to_dict(cfg):
    d = config_to_dict(cfg)
    module = type(cfg.algorithm).__module__
    assert d["algorithm"] == {
        "clip_low": 0.2, "epochs": 1, "normalize": True, "loss_agg": "token", "kl_coef": None,
        "beta_schedule": [0.1, 0.2], "clip_range": [0.8, 1.2], "extra": 3, "hook": None,
        "_target": f"{module}.Algo",
    }
    assert d["rewards"] == [{"fn": f"{module}:exact", "model": "", "weight": 1.0}]  # declared type: no _target
    assert d["optim"] == {"lr": 1e-6, "weight_decay": 0.0, "betas": [0.9, 0.999], "eps": 1e-8,
                          "warmup_steps": 0, "schedule": "constant", "min_lr_ratio": 0.0,
                          "max_grad_norm": 1.0}
    assert "_target" not in d and "_target" not in d["model"]
    assert json.loads(json.dumps(d)) == d


def test_save_config_round_trip_and_atomic(cfg, tmp_path, monkeypatch):
    path = tmp_path / "run" / "config.json"
    save_config(cfg, path)
    assert json.loads(path.read_text()) == config_to_dict(cfg)
    assert os.listdir(path.parent) == ["config.json"]  # no temp file left behind

    # A crash between writing and renaming keeps the old file whole and removes the temp file.
    before = path.read_text()
    cfg.optim.lr = 0.5

    def crash(src, dst):
        raise OSError("disk gone")
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        save_config(cfg, path)
    assert path.read_text() == before
    assert os.listdir(path.parent) == ["config.json"]


def test_did_you_mean():
    assert did_you_mean("grop", ["demo", "grpo"]) == "did you mean 'grpo'?"
    assert did_you_mean("lrr", ["lr", "eps"], "optim.") == "did you mean 'optim.lr'?"
    assert did_you_mean("zzz", ["demo", "grpo"]) == ""
