"""The config facts (``formats/model_config.py``): one precedence for every reader, validation of every key read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from colitools.formats import model_config as mc
from colitools.formats.errors import ConfigError, FormatError

ORACLES = Path(__file__).resolve().parents[2] / "oracles"


def test_expert_count_precedence_is_n_routed_then_num_local_then_num_experts():
    assert mc.routed_expert_count({"num_experts": 4}) == 4
    assert mc.routed_expert_count({"num_local_experts": 6}) == 6
    assert mc.routed_expert_count({"n_routed_experts": 8}) == 8
    # null counts as absent; equal duplicates are fine
    assert mc.routed_expert_count({"n_routed_experts": None, "num_experts": 4}) == 4
    assert mc.routed_expert_count({"n_routed_experts": 8, "num_experts": 8}) == 8
    assert mc.routed_expert_count({"hidden_size": 4}) is None
    assert mc.routed_expert_count({"num_experts": 0}) == 0  # a dense model says "no routed experts"


def test_conflicting_expert_counts_are_refused_naming_both_keys():
    with pytest.raises(
        ConfigError, match=r"conflicting expert counts \(n_routed_experts = 8, num_experts = 4\)"
    ):
        mc.routed_expert_count({"n_routed_experts": 8, "num_experts": 4})


def test_text_config_is_used_when_the_top_level_has_no_hidden_size():
    kimi = {"model_type": "kimi_k25", "quantization_config": {"weight_block_size": [64, 32]},
            "text_config": {"model_type": "deepseek_v3", "hidden_size": 16, "num_hidden_layers": 61,
                            "n_routed_experts": 384, "num_experts_per_tok": 8, "moe_intermediate_size": 12,
                            "num_nextn_predict_layers": 1, "vocab_size": 100}}  # fmt: skip
    f = mc.read_facts(kimi)
    assert (f.model_type, f.hidden_size, f.num_hidden_layers, f.mtp_layers) == ("kimi_k25", 16, 61, 1)
    assert (f.routed_experts, f.experts_per_token, f.expert_width, f.vocab_size) == (384, 8, 12, 100)
    assert f.fp8_block == (64, 32)  # quantization_config of the top level
    # a top-level hidden_size means the top level is the text model
    assert mc.hidden_size({"hidden_size": 8, "text_config": {"hidden_size": 16}}) == 8
    with pytest.raises(ConfigError, match=r"text_config\.num_hidden_layers is \"x\""):
        mc.validate_config({"text_config": {"num_hidden_layers": "x"}})


def test_expert_width_is_moe_intermediate_size_else_intermediate_size():
    assert mc.expert_width({"moe_intermediate_size": 16, "intermediate_size": 96}) == 16
    assert mc.expert_width({"intermediate_size": 64}) == 64  # OLMoE / Mixtral spelling
    assert mc.expert_width({}) is None


def test_mtp_layers_from_either_spelling():
    assert mc.mtp_layer_count({"num_nextn_predict_layers": 1}) == 1
    assert mc.mtp_layer_count({"mtp_num_hidden_layers": 2}) == 2
    assert mc.mtp_layer_count({}) == 0


def test_fp8_block_size_and_quantization_config():
    assert mc.fp8_block_size({}) is None
    assert mc.fp8_block_size({"quantization_config": {"quant_method": "fp8"}}) is None
    assert mc.fp8_block_size({"quantization_config": {"weight_block_size": [64, 128]}}) == (64, 128)
    for bad in ([128], [0, 128], [True, 128], "128x128", [128.0, 128]):
        with pytest.raises(ConfigError, match="weight_block_size .* is not two positive ints"):
            mc.fp8_block_size({"quantization_config": {"weight_block_size": bad}})
    with pytest.raises(ConfigError, match="quantization_config is a list, expected an object"):
        mc.quantization_config({"quantization_config": ["fp8"]})
    assert mc.quantization_config({"quantization_config": {}}) is None


@pytest.mark.parametrize(
    "config, shown",
    [
        ({"num_hidden_layers": "two"}, 'num_hidden_layers is "two" (expected an integer in [1, 65536])'),
        ({"num_attention_heads": 0}, "num_attention_heads is 0"),
        ({"eos_token_id": [0, "x"]}, 'eos_token_id is [0, "x"] (expected a token id or a list of token ids)'),
        ({"eos_token_id": -1}, "eos_token_id is -1"),
        ({"num_experts_per_tok": 0}, "num_experts_per_tok is 0"),
        ({"num_experts": 4, "num_experts_per_tok": 5}, "num_experts_per_tok is 5, more than the 4 routed experts"),
        ({"hidden_size": True}, "hidden_size is true"),
        ({"vocab_size": 10**40}, "vocab_size is an integer of 41 digits"),
        ({"num_hidden_layers": 2.0}, "num_hidden_layers is 2.0"),
        ({"rms_norm_eps": 0}, "rms_norm_eps is 0 (expected a number > 0)"),
        ({"partial_rotary_factor": 1.5}, "partial_rotary_factor is 1.5 (expected a number in (0, 1])"),
        ({"norm_topk_prob": 1}, "norm_topk_prob is 1 (expected true or false)"),
        ({"model_type": 5}, "model_type is 5 (expected a string)"),
        ({"mlp_only_layers": [0, "1"]}, "mlp_only_layers is [0, \"1\"]"),
        ({"rope_scaling": {"type": "yarn", "factor": "x"}}, 'rope_scaling.factor is "x"'),
        ({"rope_parameters": [1]}, "rope_parameters is [1] (expected an object)"),
        ({"text_config": 3}, "text_config is 3 (expected an object)"),
    ],
)  # fmt: skip
def test_validation_names_config_json_the_key_and_the_value(config, shown):
    with pytest.raises(ConfigError) as err:
        mc.validate_config(config)
    assert str(err.value).startswith("config.json: ") and shown in str(err.value)
    assert isinstance(err.value, FormatError)  # a ColitoolsError: the CLI prints one line


def test_validation_names_the_file_it_was_given():
    with pytest.raises(ConfigError, match=r"^/m/config\.json: num_hidden_layers is \"two\""):
        mc.read_facts({"num_hidden_layers": "two"}, where="/m/config.json")
    with pytest.raises(ConfigError, match="not a JSON object"):
        mc.validate_config([1, 2])


def test_every_oracle_config_is_valid_and_reads_its_own_expert_key():
    keys = set(mc.EXPERT_COUNT_KEYS)
    for path in sorted(ORACLES.glob("*/config.json")):
        config = json.loads(path.read_text())
        facts = mc.read_facts(config, str(path))
        text = mc.text_config(config)  # multimodal fixtures (kimi_k25) nest the text model's config
        (key,) = keys & {k for k, v in text.items() if v is not None}
        assert facts.routed_experts == text[key] and facts.num_hidden_layers == text["num_hidden_layers"]


def test_decoder_layers_past_the_base_decoder_and_its_mtp_layers_are_refused():
    """Issue 24 item 17: only the declared MTP layers may follow ``num_hidden_layers``; a tower's own layers and
    nested ``layers`` do not count."""
    names = ["model.layers.0.mlp.gate.weight", "model.layers.1.mlp.gate.weight",
             "model.visual.blocks.7.attn.qkv.weight", "vision_tower.encoder.layers.9.mlp.fc1.weight"]  # fmt: skip
    mc.check_decoder_layers({"num_hidden_layers": 2}, names)
    mc.check_decoder_layers({"num_hidden_layers": 1, "num_nextn_predict_layers": 1}, names)
    mc.check_decoder_layers({"num_hidden_layers": 1, "mtp_num_hidden_layers": 1}, names)
    with pytest.raises(ConfigError, match=r"^config.json: text_config.num_hidden_layers is 1 and no MTP layers .*"
                                          r"model.layers.1.mlp.gate.weight is of layer 1"):  # fmt: skip
        mc.check_decoder_layers({"text_config": {"num_hidden_layers": 1, "hidden_size": 8}}, names)
    with pytest.raises(ConfigError, match="num_hidden_layers is 1 plus 1 MTP layer"):
        mc.check_decoder_layers({"num_hidden_layers": 1, "num_nextn_predict_layers": 1},
                                          [*names, "layers.2.attn.wq_a.weight"])  # fmt: skip
