"""Geometry from config.json: the fields engines size the KV cache with."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.common.errors import ModelConfigError, SafeServeError, UnsupportedModel
from launcher.engines.vllm.architectures import cached_layers  # which layers vLLM's model code makes slide
from launcher.model.config import FULL, MLA, SLIDING, geometry_from_config, refuse_unsupported
from launcher.model.resolve import resolve_model, safetensors_tensor_bytes

LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
    "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
    "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 32768,
    "sliding_window": 131072, "use_sliding_window": False, "max_window_layers": 28, "torch_dtype": "bfloat16",
}


class TestWorkedExamples:
    def test_llama31_8b_is_128_kib_per_token(self) -> None:
        """Llama-3.1-8B bf16: 2 x 32 layers x 8 heads x 128 x 2 B = 128 KiB per token."""
        geometry = geometry_from_config(LLAMA_8B)
        assert geometry.kv_bytes_per_token(2) == 131072

    def test_qwen25_7b_is_57344_bytes_per_token(self) -> None:
        """Qwen2.5-7B: 57,344 B/token with its 4 KV heads; ~392 KiB if it were MHA (28 heads)."""
        geometry = geometry_from_config(QWEN25_7B)
        assert geometry.kv_bytes_per_token(2) == 57344
        mha = geometry_from_config({**QWEN25_7B, "num_key_value_heads": 28})
        assert mha.kv_bytes_per_token(2) == 401408  # 392 KiB

    def test_qwen_sliding_window_off_without_use_sliding_window(self) -> None:
        """Qwen2's config keeps its window only with use_sliding_window, as transformers does (vLLM's table)."""
        assert cached_layers(geometry_from_config(QWEN25_7B)).layer_kinds == (FULL,) * 28


class TestLayerKinds:
    def test_gemma2_alternates_starting_with_sliding(self) -> None:
        """Gemma 2 layers alternate sliding/full, even indices sliding."""
        cfg = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 64,
               "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
               "vocab_size": 100, "sliding_window": 256}
        assert cached_layers(geometry_from_config(cfg)).layer_kinds == (SLIDING, FULL, SLIDING, FULL)

    def test_gemma3_pattern_six(self) -> None:
        """Gemma 3 makes every sixth layer global."""
        cfg = {"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 12, "num_attention_heads": 4,
               "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 10, "sliding_window": 512,
               "sliding_window_pattern": 6}
        kinds = cached_layers(geometry_from_config(cfg)).layer_kinds
        assert [i for i, k in enumerate(kinds) if k == FULL] == [5, 11]

    def test_mistral_window_on_every_layer(self) -> None:
        """A Mistral-style config with a window and no layer_types slides on all layers."""
        cfg = {"model_type": "mistral", "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
               "num_key_value_heads": 2, "vocab_size": 10, "sliding_window": 4096}
        geometry = geometry_from_config(cfg)
        assert geometry.layer_kinds == (SLIDING,) * 3 and geometry.sliding_window == 4096

    def test_layer_types_list_wins(self) -> None:
        """gpt-oss lists its layer types explicitly."""
        cfg = {"model_type": "gpt_oss", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 8,
               "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 10, "sliding_window": 128,
               "layer_types": ["sliding_attention", "full_attention"] * 2}
        assert geometry_from_config(cfg).layer_kinds == (SLIDING, FULL, SLIDING, FULL)

    def test_mla_latent(self) -> None:
        """DeepSeek-V2-Lite caches kv_lora_rank + qk_rope_head_dim = 576 per token per layer."""
        cfg = {"model_type": "deepseek_v2", "hidden_size": 2048, "num_hidden_layers": 27, "num_attention_heads": 16,
               "num_key_value_heads": 16, "vocab_size": 102400, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
               "qk_nope_head_dim": 128, "v_head_dim": 128}
        geometry = geometry_from_config(cfg)
        assert geometry.layer_kinds == (MLA,) * 27
        assert geometry.kv_bytes_per_token(2) == 27 * 576 * 2

    def test_multimodal_wrapper_reads_text_config(self) -> None:
        """A VLM's text_config sizes the KV cache; the wrapper's dtype still counts."""
        cfg = {"architectures": ["LlavaForConditionalGeneration"], "torch_dtype": "float16",
               "text_config": {"model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 32,
                               "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32064},
               "vision_config": {"hidden_size": 1024, "num_hidden_layers": 24}}
        geometry = geometry_from_config(cfg)
        assert (geometry.num_layers, geometry.head_dim, geometry.config_dtype) == (32, 128, "float16")
        assert geometry.is_multimodal and geometry.vision_layers == 24

    def test_hybrid_is_refused_with_a_reason(self) -> None:
        """A model with linear-attention layers is refused, not silently mis-sized."""
        cfg = {"model_type": "qwen3_next", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
               "num_key_value_heads": 2, "vocab_size": 10,
               "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"]}
        with pytest.raises(UnsupportedModel, match="3 of 4 layers"):
            refuse_unsupported(geometry_from_config(cfg))


class TestMalformedConfigs:
    def test_missing_field_is_named(self) -> None:
        """A config without num_hidden_layers names that field."""
        cfg = dict(LLAMA_8B)
        del cfg["num_hidden_layers"]
        with pytest.raises(ModelConfigError, match="num_hidden_layers"):
            geometry_from_config(cfg)

    def test_wrong_type_is_named(self) -> None:
        """A string where a number belongs names the field and the value."""
        with pytest.raises(ModelConfigError, match="num_key_value_heads"):
            geometry_from_config({**LLAMA_8B, "num_key_value_heads": "eight"})

    @settings(max_examples=300, deadline=None)
    @given(st.dictionaries(
        st.sampled_from(sorted(LLAMA_8B) + ["head_dim", "kv_lora_rank", "qk_rope_head_dim", "sliding_window",
                                             "layer_types", "text_config"]),
        st.one_of(st.none(), st.integers(-5, 10**6), st.floats(allow_nan=True), st.text(max_size=5),
                  st.lists(st.text(max_size=20), max_size=4), st.dictionaries(st.text(max_size=5), st.integers())),
    ))
    def test_partial_configs_fail_with_one_clear_error(self, partial: dict) -> None:
        """Any partial or malformed config either parses or raises ModelConfigError, never anything else."""
        try:
            geometry_from_config(partial)
        except ModelConfigError as exc:
            assert str(exc).startswith("config.json")



class TestConfigValues:
    """Values of the wrong type or out of range: one ModelConfigError (65) naming the field."""

    @pytest.mark.parametrize(("change", "message"), [
        ({"num_key_value_heads": 0}, "'num_key_value_heads' must be positive, not 0"),
        ({"num_attention_heads": 0}, "'num_attention_heads' must be positive, not 0"),
        ({"num_hidden_layers": True}, "'num_hidden_layers' must be a whole number from 0 to 4294967296, not True"),
        ({"hidden_size": float("nan")}, "'hidden_size' must be a whole number from 0 to 4294967296, not nan"),
        ({"hidden_size": float("inf")}, "not inf"),
        ({"hidden_size": 10**400}, "not 1000000000"),
        ({"hidden_size": 2**33}, "not 8589934592"),
        ({"num_hidden_layers": 2**31}, "'num_hidden_layers' of 2147483648 is beyond any model (at most 4096)"),
        ({"hidden_size": 3584.5}, "not 3584.5"),
        ({"hidden_size": [3584]}, "'hidden_size' must be a whole number from 0 to 4294967296, not [3584]"),
        ({"vocab_size": {"n": 1}}, "'vocab_size' must be a whole number"),
        ({"torch_dtype": "banana"}, "'torch_dtype' must be a torch dtype name such as bfloat16, not 'banana'"),
        ({"torch_dtype": ["bfloat16"]}, "'torch_dtype' must be a torch dtype name such as bfloat16, not ['bfloat16']"),
        ({"dtype": "torch.banana"}, "'dtype' must be a torch dtype name"),
        ({"layer_types": [{}] * 28}, "'layer_types' entries must be names, not {}"),
        ({"layer_types": [["full_attention"]] * 28}, "'layer_types' entries must be names"),
        ({"max_position_embeddings": float("inf")},
         "'max_position_embeddings' must be a number from 0 to 1e+31, not inf"),
        ({"max_position_embeddings": float("nan")}, "not nan"),
        ({"max_position_embeddings": 10**400}, "not 1000000000"),
        ({"max_position_embeddings": [32768]}, "not [32768]"),
        ({"max_position_embeddings": True}, "not True"),
        ({"seq_length": -1}, "'seq_length' must be a number from 0 to 1e+31, not -1"),
        ({"rope_scaling": [1.0]}, "'rope_scaling' must be an object, not [1.0]"),
        ({"rope_scaling": {"rope_type": "linear", "factor": float("nan")}}, "'rope_scaling.factor' must be a number"),
        ({"rope_scaling": {"type": "linear", "factor": 1e300}},
         "'rope_scaling.factor' must be a number above 0 to 6.55e+04"),
        ({"rope_scaling": {"type": "linear", "factor": 0}}, "'rope_scaling.factor' must be a number above 0"),
        ({"rope_parameters": {"full_attention": {"factor": "8"}}}, "'rope_parameters.factor' must be a number"),
        ({"quantization_config": {"quant_method": "awq", "bits": float("nan")}}, "bits must be a whole number"),
        ({"quantization_config": {"quant_method": "gptq", "bits": [4]}}, "bits must be a whole number from 1 to 64"),
        ({"quantization_config": {"quant_method": "awq", "bits": 1e400}}, "bits must be a whole number"),
    ])
    def test_bad_value_names_the_field(self, change: dict, message: str) -> None:
        with pytest.raises(ModelConfigError) as caught:
            geometry_from_config({**QWEN25_7B, **change})
        assert str(caught.value).startswith("config.json: ") and message in str(caught.value)
        assert caught.value.exit_code == 65 and len(str(caught.value)) < 200

    @pytest.mark.parametrize(("change", "check"), [
        ({"hidden_size": 3584.0}, lambda g: g.hidden_size == 3584),  # integral floats, as transformers reads them
        ({"torch_dtype": "torch.float16"}, lambda g: g.config_dtype == "float16"),
        ({"torch_dtype": None, "dtype": "bfloat16"}, lambda g: g.config_dtype == "bfloat16"),
        ({"torch_dtype": "float32"}, lambda g: g.config_dtype == "float32"),
        ({"model_max_length": int(1e30)}, lambda g: g.text_config["model_max_length"] == int(1e30)),
        ({"rope_scaling": None}, lambda g: True),
        ({"quantization_config": {"quant_method": "awq", "bits": 4.0}}, lambda g: g.quantization.bits == 4),
    ])
    def test_valid_variants_still_parse(self, change: dict, check: object) -> None:
        assert check(geometry_from_config({**QWEN25_7B, **change}))  # type: ignore[operator]

    def test_kv_heads_alias_zero_names_the_field(self) -> None:
        cfg = {k: v for k, v in QWEN25_7B.items() if k != "num_key_value_heads"}
        with pytest.raises(ModelConfigError, match="'num_key_value_heads' must be positive, not 0"):
            geometry_from_config({**cfg, "num_kv_heads": 0})

    @settings(max_examples=300, deadline=None, derandomize=True, database=None)
    @given(st.sampled_from(sorted(QWEN25_7B) + ["head_dim", "layer_types", "rope_scaling", "dtype", "seq_length",
                                                 "quantization_config", "model_max_length", "kv_lora_rank"]),
           st.recursive(st.none() | st.booleans() | st.integers(-(10**400), 10**400) | st.floats()
                        | st.text(max_size=8),
                        lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                        max_leaves=8))
    def test_any_single_bad_value_is_a_config_error(self, key: str, value: object) -> None:
        """Replacing any one field by any JSON value parses or raises ModelConfigError; nothing else escapes."""
        try:
            geometry = geometry_from_config({**QWEN25_7B, key: value})
        except ModelConfigError as exc:
            assert str(exc).startswith("config.json: ") and "\n" not in str(exc)
        else:
            assert geometry.num_layers >= 1 and geometry.num_kv_heads >= 1 and geometry.head_dim >= 1


def _write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> int:
    header, offset = {}, 0
    sizes = {"BF16": 2, "F32": 4, "I32": 4, "F8_E4M3": 1}
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for dim in shape:
            n *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)
    return offset


class TestResolution:
    def test_local_dir_reads_safetensors_headers(self, tmp_path: Path) -> None:
        """A local directory's weight bytes are the tensor ranges in its safetensors headers."""
        (tmp_path / "config.json").write_text(json.dumps(QWEN25_7B))
        expected = _write_safetensors(tmp_path / "a.safetensors", {"w": ("BF16", [64, 32]), "q": ("I32", [8, 8])})
        expected += _write_safetensors(tmp_path / "b.safetensors", {"s": ("F8_E4M3", [100])})
        model = resolve_model(str(tmp_path))
        assert (model.source, model.weight_bytes) == ("local", 64 * 32 * 2 + 8 * 8 * 4 + 100)
        assert model.weight_bytes == expected
        assert safetensors_tensor_bytes(tmp_path / "b.safetensors") == 100

    def test_local_dir_prefers_index_total_size(self, tmp_path: Path) -> None:
        """The index's metadata.total_size is the checkpoint's own figure."""
        (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B))
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 16060522496}}))
        assert resolve_model(str(tmp_path)).weight_bytes == 16060522496

    def test_alias_resolves_offline(self) -> None:
        """The qwen2.5-7b alias carries its config and checkpoint size."""
        model = resolve_model("qwen2.5-7b")
        assert model.source == "alias" and model.weight_bytes == 15231233024
        assert model.geometry.kv_bytes_per_token(2) == 57344

    def test_unknown_model_is_one_line(self) -> None:
        """A name that is nothing we know says so and lists the aliases."""
        with pytest.raises(SafeServeError, match="not a directory, a known alias"):
            resolve_model("no-such-model")

    def test_every_profile_parses(self) -> None:
        """Every alias in profiles/ resolves to a geometry with positive weights."""
        from launcher.model.resolve import list_aliases

        aliases = list_aliases()
        assert {"qwen2.5-7b", "llama-3.1-8b", "deepseek-v2-lite", "gpt-oss-20b", "gemma-2-9b"} <= set(aliases)
        for alias in aliases:
            model = resolve_model(alias)
            assert model.weight_bytes > 0 and model.geometry.num_layers > 0, alias


def test_a_hybrid_class_whose_layers_are_all_attention_is_not_hybrid() -> None:
    """Granite 4.0 micro is a GraniteMoeHybrid config with 40 attention layers: planned, not refused."""
    from launcher.model.config import refuse_unsupported

    base = {"architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid", "hidden_size": 256,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
            "max_position_embeddings": 4096}
    refuse_unsupported(geometry_from_config({**base, "layer_types": ["attention"] * 4}))
    with pytest.raises(UnsupportedModel):
        refuse_unsupported(geometry_from_config({**base, "layer_types": ["attention", "mamba"] * 2}))
    with pytest.raises(UnsupportedModel):  # no per-layer list: the class may hold Mamba layers
        refuse_unsupported(geometry_from_config(base))
