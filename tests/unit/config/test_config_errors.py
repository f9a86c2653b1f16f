"""Config errors name where the bad value came from: the YAML file with line and column, or the
file / ``--set`` that gave a value outside its range."""

import pytest

from paddle_mla.config.schema import ConfigError, load_config


def _errors(path=None, overrides=()):
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return info.value.errors


def test_yaml_syntax_error_names_file_line_and_column(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("scheduler:\n  max_num_seqs: 4\n  bad: [1, 2\n")
    (msg,) = _errors(cfg)
    assert msg.startswith(f"{cfg}:") and "not valid YAML" in msg and "<unicode string>" not in msg
    line = int(msg[len(str(cfg)) + 1:].split(":")[0])
    assert line >= 3


def test_range_errors_name_the_source_of_the_value(tmp_path):
    cfg = tmp_path / "range.yaml"
    cfg.write_text("scheduler:\n  max_num_seqs: 0\n")
    errors = _errors(cfg, ["cache.block_size=48"])
    assert f"{cfg}: 'scheduler.max_num_seqs' is 0; allowed: > 0" in errors
    assert "--set cache.block_size=48: 'cache.block_size' is 48; allowed: a power of two >= 1" in errors


EMPTY_MODEL = ("'model' (the model path) is empty; give a local checkpoint folder (config.json + *.safetensors), "
               "or tiny for the built-in test model")


@pytest.mark.parametrize("override", ["model=", "model=  ", 'model=""'])
def test_an_empty_model_path_says_so(tmp_path, override):
    assert _errors(None, [override]) == [f"--set {override}: {EMPTY_MODEL}"]
    cfg = tmp_path / "empty_model.yaml"
    cfg.write_text('model: ""\n')
    assert _errors(cfg) == [f"{cfg}: {EMPTY_MODEL}"]
