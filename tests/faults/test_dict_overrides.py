"""Every dict-valued config field takes Hydra's documented forms: assign a dict (`key={name: value}`,
merged into the defaults), set one key (`key.name=value`) and append one key (`+key.name=value`).

The fields are found from the schemas (`dict_fields`), so one added later is covered; each needs a
sample entry below (a key its validation accepts)."""

from __future__ import annotations

import pytest

from rlharness.config.run import RunConf
from rlharness.config.schema import ConfigError
from rlharness.config.store import SCHEMAS, dict_fields
from rlharness.launch.preflight import compose_typed

# (group option that has the field, or None for RunConf's own) -> field -> (an entry's key, its value as
# written on the command line, as composed).
SAMPLES = {
    ("judger", "remote"): {"headers": ("Authorization", "env:HOME", "env:HOME")},
    ("judger", "router"): {"weights": ("countdown", "0.5", 0.5)},
    ("task", "reasoning_gym"): {"dataset_config": ("max_terms", "3", 3)},
    (None, None): {"tasks": None},  # tasks.<name> is a whole task entry: tested below
}
FIELDS = sorted({(group, option, key) for group, impls in SCHEMAS.items() for option, schema in impls.items()
                 for key, _ in dict_fields(schema) if (group, option) in SAMPLES})


def test_every_dict_field_has_a_sample():
    found = {(None, None, key) for key, _ in dict_fields(RunConf)}
    found |= {(group, schema.__name__, key) for group, impls in SCHEMAS.items() for schema in impls.values()
              for key, _ in dict_fields(schema)}
    sampled = {(None, None, k) for k in SAMPLES[None, None]}
    sampled |= {(g, SCHEMAS[g][o].__name__, k) for (g, o), fields in SAMPLES.items() if g for k in fields}
    assert found == sampled, f"dict-valued fields without a sample in this test: {found - sampled}"


@pytest.mark.parametrize("form", ["assign", "set", "append"])
@pytest.mark.parametrize("group, option, key", FIELDS)
def test_a_dict_field_takes_each_of_hydras_forms(group, option, key, form):
    name, written, composed = SAMPLES[group, option][key]
    override = {"assign": f"{group}.{key}={{{name}: '{written}'}}" if isinstance(composed, str)
                else f"{group}.{key}={{{name}: {written}}}",
                "set": f"{group}.{key}.{name}={written}",
                "append": f"+{group}.{key}.{name}={written}"}[form]
    _, conf = compose_typed([f"{group}={option}", override, "hydra.run.dir=/tmp/unused"])
    assert getattr(getattr(conf, group), key)[name] == composed


@pytest.mark.parametrize("override", ["tasks.padded.sampling.max_tokens=12", "+tasks.padded.sampling.max_tokens=12",
                                      "tasks.padded.sampling={max_tokens: 12}"])
def test_a_tasks_sampling_takes_each_form(override):
    _, conf = compose_typed(["experiment=arith_mix", override, "hydra.run.dir=/tmp/unused"])
    assert conf.tasks["padded"].sampling == {"max_tokens": 12}


def test_a_typo_inside_an_open_dict_of_typed_entries_is_still_refused():
    with pytest.raises(ConfigError, match=r"tasks.padded.wieght.*did you mean"):
        compose_typed(["experiment=arith_mix", "tasks.padded.wieght=0.5", "hydra.run.dir=/tmp/unused"])
    with pytest.raises(ConfigError, match=r"tasks.padded.sampling.*max_tokns"):
        compose_typed(["experiment=arith_mix", "tasks.padded.sampling.max_tokns=3", "hydra.run.dir=/tmp/unused"])


def test_the_issues_example_on_the_command_line(tmp_path):
    """`judger.headers.Authorization=env:TOKEN` (no `+`) reaches the config as `+...` does."""
    import yaml

    from tests.helpers import run_cli

    proc = run_cli(["judger=remote", "judger.headers={Authorization: 'env:JUDGE_TOKEN'}",
                    "judger.headers.X-Team=env:JUDGE_TOKEN", "--cfg", "job"], cwd=tmp_path,
                   env={"JUDGE_TOKEN": "Bearer abc"})
    assert yaml.safe_load(proc.stdout)["judger"]["headers"] == {"Authorization": "env:JUDGE_TOKEN",
                                                               "X-Team": "env:JUDGE_TOKEN"}
