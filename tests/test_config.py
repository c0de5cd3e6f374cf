"""The one options object: checked when it is made (one line naming the flag), settled there from the
model's header, frozen after, and made again field for field in a rank process."""

import dataclasses
import json

import pytest

from radiance.config import Config, ConfigError, flag
from radiance.tools import generate, launch


def test_it_settles_the_context_and_the_kv_cache_from_the_model(tiny_model):  # the tiny model holds 256
    config = Config(model=str(tiny_model), max_seqs=3, block_size=16)
    assert (config.max_context, config.max_blocks, config.num_blocks) == (256, 16, 48)
    asked = Config(model=str(tiny_model), max_context=100, num_blocks=5)
    assert (asked.max_context, asked.max_blocks, asked.num_blocks) == (100, 7, 5)
    assert Config(model=str(tiny_model), max_context=100_000).max_context == 256  # never more than the model holds


def test_it_is_frozen(tiny_model):
    config = Config(model=str(tiny_model))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_seqs = 8


def test_a_rank_makes_the_same_object_from_its_fields(tiny_model):
    config = Config(model=tiny_model, tp=2, launched=True, max_context=64, run_ahead=False, profile=True)
    assert config.model == str(tiny_model)
    assert Config(**json.loads(json.dumps(dataclasses.asdict(config)))) == config


@pytest.mark.parametrize("given,message", [
    ({"tp": 0}, "--tp must be at least 1, not 0"),
    ({"max_step_tokens": 0}, "--max-step-tokens must be at least 1, not 0"),
    ({"max_context": 1}, "--max-context must be at least 2, not 1"),
    ({"num_blocks": -1}, "num_blocks must be at least 0, not -1"),  # no command takes it: the field's name
    ({"threads": 0}, "--threads-per-rank must be at least 1, not 0"),
    ({"step_timeout": 0}, "--step-timeout must be more than 0 seconds, not 0"),
    ({"device": "gpu"}, "--device must be 'auto' or 'host', not 'gpu'"),
    ({"collective_wire": "fp8"}, "--collective-wire must be 'auto', 'f32' or 'bf16', not 'fp8'"),
    ({"kv_cache_dtype": "fp8"}, "--kv-cache-dtype must be 'auto', 'f16' or 'f32', not 'fp8'"),
    ({"kv_cache_dtype": "F16"}, "--kv-cache-dtype must be 'auto', 'f16' or 'f32', not 'F16'"),
])
def test_a_bad_value_is_one_line_naming_its_flag(tiny_model, given, message):
    with pytest.raises(ConfigError) as error:
        Config(model=str(tiny_model), **given)
    assert str(error.value) == message


def test_a_file_that_is_no_model_is_named(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello")
    with pytest.raises(ValueError, match=f"^not a .rad model: {path}: "):
        Config(model=str(path))
    with pytest.raises(ValueError, match=f"^{tmp_path / 'nope.rad'}: No such file or directory$"):
        Config(model=str(tmp_path / "nope.rad"))


def test_the_flags_an_error_names_are_the_commands_own():
    taken = {opt for command in (generate.main, launch.main) for param in command.params for opt in param.opts}
    named = {flag(field.name) for field in dataclasses.fields(Config)}
    assert {name for name in named if name.startswith("--")} <= taken
    assert {name for name in named if not name.startswith("--")} == {
        "activation_dtype", "block_size", "num_blocks", "progress", "launched", "profile", "return_buffer"}


@pytest.mark.parametrize("asked,host,card", [("auto", "f16", "f32"), ("f32", "f32", "f32"), ("f16", "f16", None)])
def test_the_kv_cache_type_settles_per_domain(tiny_model, asked, host, card):
    """auto: f16 on the host rows, f32 on a card (whose attention rows read f32 only); f16 asked on a
    card is one line naming the flag."""
    config = Config(model=str(tiny_model), kv_cache_dtype=asked)
    assert config.kv_cache_type(card=False) == host
    if card is None:
        with pytest.raises(ConfigError) as error:
            config.kv_cache_type(card=True)
        assert str(error.value).startswith("--kv-cache-dtype f16: a card's attention rows read an f32 cache only")
        assert "\n" not in str(error.value)
    else:
        assert config.kv_cache_type(card=True) == card


def test_a_bad_kv_cache_dtype_on_the_command_line_names_the_option(tiny_model):
    from click.testing import CliRunner

    result = CliRunner().invoke(generate.main, ["--model", str(tiny_model), "--prompt", "hi", "--kv-cache-dtype",
                                                "bf8"])
    assert result.exit_code != 0
    assert "--kv-cache-dtype" in result.output and "'bf8' is not one of" in result.output
