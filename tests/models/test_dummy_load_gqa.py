"""``load_format: dummy`` for the GQA families (qwen3, llama, ernie4_5 and their MoE).

The oracle is a checkpoint ``transformers`` writes for each of the GQA oracle's tiny configs (every
family, bias flag, tied/untied head and MoE variant there): the dummy layout must name exactly its
tensors with its shapes, and the dummy load must give what the real loader gives from those files
(names, shapes, dtypes), per tensor-parallel rank where the heads split. Then the engine runs on a
folder holding only config.json.
"""

import json
import shutil

import pytest
from test_dummy_load import PROMPTS, _generate, _same_as_loader
from test_gqa_oracle import CONFIGS, _hf_model

from paddle_mla.models import load_arch
from paddle_mla.models.dummy_weights import DummyReader
from paddle_mla.models.safetensors_io import CheckpointReader


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def hf_checkpoint(request, tmp_path_factory):
    prefix, extra, save_kw = CONFIGS[request.param]
    path = tmp_path_factory.mktemp(request.param)
    _hf_model(prefix, extra).save_pretrained(path, **save_kw)
    return request.param, path


def test_layout_is_the_published_one(hf_checkpoint):
    name, path = hf_checkpoint
    reader = CheckpointReader(path)
    expected = {k: list(reader.file_of(k).shape(k)) for k in reader.keys()}
    got = {k: shape for k, (shape, _) in DummyReader(load_arch(path)).layout.items()}
    assert sorted(got) == sorted(expected), (name, sorted(set(got) ^ set(expected)))
    assert got == expected, name


def test_builds_what_the_loader_loads(hf_checkpoint):
    _, path = hf_checkpoint
    _same_as_loader(path, splits=[(0, 1)] + ([(0, 2), (1, 2)] if _splits_by_two(path) else []))


def _splits_by_two(path) -> bool:
    cfg = json.loads((path / "config.json").read_text())
    return cfg["num_attention_heads"] % 2 == 0 and cfg.get("num_key_value_heads", 0) % 2 == 0


@pytest.mark.parametrize("name", ["qwen3_g2_yarn_sharded", "ernie4_5_moe_g3_shared_bias"])
def test_generate_from_config_json_alone(tmp_path, name):
    prefix, extra, save_kw = CONFIGS[name]
    full = tmp_path / "full"
    _hf_model(prefix, extra).save_pretrained(full, **save_kw)
    path = tmp_path / "config_only"
    path.mkdir()
    shutil.copy(full / "config.json", path / "config.json")
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    tokens = _generate(path, 1, PROMPTS, attention={"backend": "native"})
    assert [len(t) for t in tokens] == [6] * 3 and all(0 <= x < vocab for t in tokens for x in t)
    assert len({x for t in tokens for x in t}) > 1
    assert _generate(path, 1, PROMPTS, attention={"backend": "native"}) == tokens
