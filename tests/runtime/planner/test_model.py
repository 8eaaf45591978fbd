"""Model inspection: real configs, safetensors headers written here by hand, and clear errors."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from npu_runtime.planner.config_fields import ModelError
from npu_runtime.planner.model import ModelInfo, inspect_model
from npu_runtime.planner.weight_files import safetensors_data_bytes

from tests.runtime.conftest import FIXTURES


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]], metadata: bool = True) -> int:
    """A .safetensors file in the format's own terms: u64 little-endian header size, JSON header, data."""
    sizes = {"F32": 4, "BF16": 2, "F16": 2, "I8": 1}
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}} if metadata else {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for dim in shape:
            n *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)
    return offset


def write_config(directory: Path, **fields: Any) -> Path:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 100,
        "max_position_embeddings": 256,
        "torch_dtype": "bfloat16",
    }
    config.update(fields)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    return directory


class TestRealConfigs:
    def test_dense_gqa(self, models: dict[str, ModelInfo]) -> None:
        qwen = models["qwen2.5-72b-instruct"]
        assert (qwen.architecture, qwen.num_layers, qwen.num_kv_heads, qwen.head_dim) == (
            "Qwen2ForCausalLM",
            80,
            8,
            128,
        )
        assert not (qwen.is_mla)
        assert not (qwen.is_moe)
        assert not (qwen.is_multimodal)
        assert not (qwen.is_encoder_decoder)
        assert qwen.sliding_window is None  # use_sliding_window: false
        assert qwen.max_position_embeddings == 32768

    def test_shape_estimate_matches_published_totals(self, models: dict[str, ModelInfo]) -> None:
        # Qwen2.5-72B-Instruct: 72,706,203,648 parameters (weight statistics quoted in SOURCES.md).
        assert models["qwen2.5-72b-instruct"].param_count == 72_706_203_648
        # Llama-3.1-8B: its index's metadata.total_size is 16,060,522,496 bytes of bfloat16.
        llama = models["llama-3.1-8b"]
        assert llama.param_count * 2 == 16_060_522_496 == llama.weight_bytes
        assert llama.weight_source == "safetensors-index"
        assert models["qwen2.5-7b"].weight_source == "estimated-from-shape"

    def test_llama3_rope_is_not_scaled_again(self, models: dict[str, ModelInfo]) -> None:
        assert models["llama-3.1-70b"].max_position_embeddings == 131072

    def test_mla_moe(self, models: dict[str, ModelInfo]) -> None:
        ds = models["deepseek-v2-lite"]
        assert ds.is_mla
        assert ds.is_moe
        assert (ds.kv_lora_rank, ds.qk_rope_head_dim, ds.num_experts, ds.num_experts_per_tok) == (
            512,
            64,
            64,
            6,
        )
        assert ds.max_position_embeddings == 163840  # yarn: already scaled, as vLLM keeps it
        # MLA caches one latent per layer, not split over ranks: 27 x (512 + 64) x 2 bytes.
        assert ds.kv_bytes_per_token(tensor_parallel=4, pipeline_parallel=1, dtype_bytes=2) == 27 * 576 * 2
        assert 15.5e9 < ds.param_count < 16e9

    def test_moe(self, models: dict[str, ModelInfo]) -> None:
        moe = models["qwen3-30b-a3b"]
        assert moe.is_moe
        assert not moe.is_mla
        assert (moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size) == (128, 8, 768)
        assert 30.4e9 < moe.param_count < 30.6e9

    def test_multimodal_nested_text_config(self, models: dict[str, ModelInfo]) -> None:
        llava = models["llava-1.5-7b"]
        assert llava.is_multimodal
        assert llava.architecture == "LlavaForConditionalGeneration"
        # text_config leaves the shape to LlamaConfig's defaults; max_position_embeddings is its own.
        assert (llava.num_layers, llava.hidden_size, llava.max_position_embeddings) == (32, 4096, 4096)
        assert llava.dtype == "float16"
        assert any("defaults" in note for note in llava.notes)
        assert 7.0e9 < llava.param_count < 7.2e9

    @pytest.mark.parametrize("key", ["text_config", "llm_config", "language_config"])
    def test_every_nested_text_config_makes_a_multimodal_model(self, tmp_path: Path, key: str) -> None:
        text = {"model_type": "llama", "num_hidden_layers": 3, "hidden_size": 64, "num_attention_heads": 4}
        info = inspect_model(write_config(tmp_path, num_hidden_layers=None, **{key: text}))
        assert (info.is_multimodal, info.num_layers) == (True, 3)
        assert f"language model read from {key}" in info.notes

    def test_gqa_heads_replicate_when_fewer_than_ranks(self, models: dict[str, ModelInfo]) -> None:
        qwen = models["qwen2.5-7b"]  # 4 KV heads
        per_rank = [qwen.kv_bytes_per_token(tensor_parallel=tp, pipeline_parallel=1, dtype_bytes=2) for tp in (1, 4, 8)]
        assert per_rank == [28 * 2 * 4 * 128 * 2, 28 * 2 * 1 * 128 * 2, 28 * 2 * 1 * 128 * 2]

    @pytest.mark.parametrize(
        ("stated", "dtype"), [("torch.float16", "float16"), ("half", "float16"), ("float", "float32")]
    )
    def test_the_checkpoint_dtype_has_its_canonical_name(self, tmp_path: Path, stated: str, dtype: str) -> None:
        assert inspect_model(write_config(tmp_path, torch_dtype=stated)).dtype == dtype

    def test_config_file_path_is_accepted(self) -> None:
        assert inspect_model(FIXTURES / "qwen2.5-7b" / "config.json").num_layers == 28


class TestSafetensors:
    def test_header_bytes(self, tmp_path: Path) -> None:
        data = write_safetensors(tmp_path / "model.safetensors", {"a": ("BF16", [4, 8]), "b": ("F32", [3])})
        assert data == 4 * 8 * 2 + 3 * 4
        assert safetensors_data_bytes(tmp_path / "model.safetensors") == data

    def test_weights_from_headers_of_all_files(self, tmp_path: Path) -> None:
        write_config(tmp_path)
        a = write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {"x": ("BF16", [64, 64])})
        b = write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {"y": ("I8", [10])}, metadata=False)
        info = inspect_model(tmp_path)
        assert (info.weight_bytes, info.weight_source) == (a + b, "safetensors-headers")

    def test_index_without_total_size_reads_its_shards(self, tmp_path: Path) -> None:
        write_config(tmp_path)
        a = write_safetensors(tmp_path / "s1.safetensors", {"x": ("F16", [5, 5])})
        index = {"metadata": {}, "weight_map": {"x": "s1.safetensors"}}
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
        assert inspect_model(tmp_path).weight_bytes == a

    def test_index_total_size_wins(self, tmp_path: Path) -> None:
        write_config(tmp_path)
        write_safetensors(tmp_path / "s1.safetensors", {"x": ("F16", [5, 5])})
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 12345}}))
        info = inspect_model(tmp_path)
        assert (info.weight_bytes, info.weight_source) == (12345, "safetensors-index")

    @pytest.mark.parametrize(
        ("content", "message"),
        [
            (b"\x01\x02", "too short"),
            (struct.pack("<Q", 10**12), "not plausible"),
            (struct.pack("<Q", 50) + b"{}", "truncated"),
            (struct.pack("<Q", 4) + b"nope", "not valid JSON"),
            (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
        ],
    )
    def test_broken_files_name_the_file(self, tmp_path: Path, content: bytes, message: str) -> None:
        path = tmp_path / "bad.safetensors"
        path.write_bytes(content)
        with pytest.raises(ModelError, match=message) as caught:
            safetensors_data_bytes(path)
        assert "bad.safetensors" in str(caught.value)

    def test_offsets_that_disagree_with_the_shape(self, tmp_path: Path) -> None:
        header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}).encode()
        path = tmp_path / "bad.safetensors"
        path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
        with pytest.raises(ModelError, match=r"'w'.*needs 16 bytes"):
            safetensors_data_bytes(path)

    @pytest.mark.parametrize(
        ("index", "message"),
        [
            ({"metadata": None}, r"field 'metadata': expected a JSON object"),
            ({"metadata": [12345]}, r"field 'metadata': expected a JSON object"),
            ({"metadata": {}, "weight_map": None}, r"field 'weight_map': expected an object"),
            ({"metadata": {}, "weight_map": ["s1.safetensors"]}, r"field 'weight_map': expected an object"),
            ({"weight_map": {"x": 1}}, r"field 'weight_map': expected an object"),
        ],
    )
    def test_a_malformed_index_names_the_file_and_field(
        self, tmp_path: Path, index: dict[str, Any], message: str
    ) -> None:
        write_config(tmp_path)
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
        with pytest.raises(ModelError, match=message) as caught:
            inspect_model(tmp_path)
        assert "model.safetensors.index.json" in str(caught.value)

    @pytest.mark.parametrize(
        ("tensor", "message"),
        [
            ({"dtype": "F16", "shape": 4, "data_offsets": [0, 8]}, "invalid shape 4"),
            ({"dtype": "F16", "shape": "ab", "data_offsets": [0, 8]}, "invalid shape 'ab'"),
            ({"dtype": "F16", "shape": None, "data_offsets": [0, 8]}, "invalid shape None"),
            ({"dtype": "F16", "shape": [2, -2], "data_offsets": [0, 8]}, r"invalid shape \[2, -2\]"),
            ({"dtype": ["F16"], "shape": [4], "data_offsets": [0, 8]}, r"invalid dtype \['F16'\]"),
        ],
    )
    def test_a_malformed_tensor_names_the_file_and_tensor(
        self, tmp_path: Path, tensor: dict[str, Any], message: str
    ) -> None:
        header = json.dumps({"w": tensor}).encode()
        path = tmp_path / "bad.safetensors"
        path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
        with pytest.raises(ModelError, match=message) as caught:
            safetensors_data_bytes(path)
        assert "bad.safetensors" in str(caught.value)
        assert "'w'" in str(caught.value)


class TestErrors:
    def test_missing_config(self, tmp_path: Path) -> None:
        with pytest.raises(ModelError, match=r"config\.json: file not found"):
            inspect_model(tmp_path)

    def test_invalid_json(self, tmp_path: Path) -> None:
        (tmp_path / "config.json").write_text('{"hidden_size": 4,\n  oops}')
        with pytest.raises(ModelError, match=r"not valid JSON.*line 2"):
            inspect_model(tmp_path)

    def test_missing_field_is_named(self, tmp_path: Path) -> None:
        write_config(tmp_path, num_hidden_layers=None)
        with pytest.raises(ModelError, match="missing field 'num_hidden_layers'"):
            inspect_model(tmp_path)

    def test_wrong_type_is_named(self, tmp_path: Path) -> None:
        write_config(tmp_path, hidden_size="big")
        with pytest.raises(ModelError, match="field 'hidden_size': expected an integer, got 'big'"):
            inspect_model(tmp_path)

    def test_a_rope_type_that_is_not_a_string_is_named(self, tmp_path: Path) -> None:
        write_config(tmp_path, rope_scaling={"type": ["linear"], "factor": 2.0})
        with pytest.raises(ModelError, match=r"field 'rope_scaling': expected a string rope type"):
            inspect_model(tmp_path)

    def test_a_vision_tower_of_unknown_shape_is_not_counted(self, tmp_path: Path) -> None:
        plain = inspect_model(write_config(tmp_path / "plain")).param_count
        odd = write_config(tmp_path / "odd", vision_config={"hidden_size": 32, "depth": 2, "out_hidden_size": "x"})
        assert inspect_model(odd).param_count == plain

    def test_nested_field_is_named_with_its_prefix(self, tmp_path: Path) -> None:
        write_config(tmp_path, text_config={"model_type": "custom", "num_hidden_layers": 2, "hidden_size": 8})
        with pytest.raises(ModelError, match=r"missing field 'text_config\.num_attention_heads'"):
            inspect_model(tmp_path)


class TestHints:
    def test_quantization_config(self, tmp_path: Path) -> None:
        write_config(tmp_path, quantization_config={"quant_method": "gptq", "bits": 4})
        info = inspect_model(tmp_path)
        assert (info.quantization, info.quant_bits) == ("gptq", 4)
        # Linear layers at 4 bits; embeddings, lm_head and norms stay bfloat16.
        embeddings_and_norms = 2 * 100 * 64 + 2 * 2 * 64 + 64
        linear = info.param_count - embeddings_and_norms
        assert info.weight_bytes == linear // 2 + 2 * embeddings_and_norms

    def test_modelslim_description(self, tmp_path: Path) -> None:
        write_config(tmp_path)
        (tmp_path / "quant_model_description.json").write_text(json.dumps({"model_quant_type": "W8A8"}))
        info = inspect_model(tmp_path)
        assert (info.quantization, info.quant_scheme, info.quant_bits) == ("ascend", "W8A8", 8)

    def test_modelslim_types_per_tensor_class(self, tmp_path: Path) -> None:
        write_config(tmp_path)
        description = {
            "model_quant_type": "W8A8_DYNAMIC",
            "model.layers.0.self_attn.q_proj.weight": "W8A8",
            "model.layers.0.mlp.experts.0.gate_proj.weight": "W4A8_DYNAMIC",
            "model.layers.0.mlp.experts.0.gate_proj.weight_scale": "W4A8_DYNAMIC",
            "model.embed_tokens.weight": "FLOAT",
        }
        (tmp_path / "quant_model_description.json").write_text(json.dumps(description))
        info = inspect_model(tmp_path)
        assert (info.quant_scheme, info.quant_bits, info.expert_quant_bits) == ("W8A8_DYNAMIC", 8, 4)

    def test_an_unknown_modelslim_type_is_named(self, tmp_path: Path) -> None:
        write_config(tmp_path)
        description = {"model.layers.0.self_attn.q_proj.weight": "INT3_MAGIC"}
        (tmp_path / "quant_model_description.json").write_text(json.dumps(description))
        with pytest.raises(ModelError, match=r"quant_model_description.json: linear layers: unknown .*'INT3_MAGIC'"):
            inspect_model(tmp_path)

    def test_sliding_window_everywhere(self, tmp_path: Path) -> None:
        write_config(tmp_path, model_type="mistral", sliding_window=128)
        info = inspect_model(tmp_path)
        assert (info.sliding_window, info.sliding_layers) == (128, 2)

    def test_hybrid_window_counts_full_length(self, tmp_path: Path) -> None:
        write_config(tmp_path, sliding_window=128, layer_types=["sliding_attention", "full_attention"])
        info = inspect_model(tmp_path)
        assert (info.sliding_window, info.sliding_layers) == (None, 1)

    def test_linear_rope_factor_scales_the_context(self, tmp_path: Path) -> None:
        write_config(tmp_path, rope_scaling={"rope_type": "linear", "factor": 4.0})
        assert inspect_model(tmp_path).max_position_embeddings == 1024

    def test_tokenizer_limit(self, tmp_path: Path) -> None:
        write_config(tmp_path)
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 128}))
        assert inspect_model(tmp_path).max_position_embeddings == 128

    def test_encoder_decoder_and_pooling(self, tmp_path: Path) -> None:
        write_config(tmp_path / "t5", architectures=["T5ForConditionalGeneration"], is_encoder_decoder=True)
        write_config(tmp_path / "emb", architectures=["Qwen2ForSequenceClassification"])
        assert inspect_model(tmp_path / "t5").is_encoder_decoder
        assert inspect_model(tmp_path / "emb").is_pooling
