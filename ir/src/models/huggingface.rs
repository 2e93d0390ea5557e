//! Decoders described by a Hugging Face `transformers` configuration (`config.json`): the
//! shape a model's own export would show, read from the 2 KB that describe it, so that a
//! 671 B model is planned without exporting it.
//!
//! Read as `transformers` 5.x reads them (`models/<type>/configuration_<type>.py`): the
//! fields a family leaves out take that class's defaults. Families: `llama`, `mistral`,
//! `qwen2`, `qwen3`, `mixtral`, `qwen3_moe`, `deepseek_v3`, `gpt_oss`.

use serde_json::{Map, Value};

use super::{GptSpec, LatentAttention, ModelError, MoeSpec, Router};

/// The families read, by `model_type`.
pub const FAMILIES: [&str; 8] = [
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "mixtral",
    "qwen3_moe",
    "deepseek_v3",
    "gpt_oss",
];

/// Whether `text` is a `transformers` configuration: a JSON object with a `model_type`.
pub fn is_config(text: &str) -> bool {
    serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| v.get("model_type").map(Value::is_string))
        .unwrap_or(false)
}

/// The decoder `text` configures, at `sequence` positions (a configuration gives only the
/// longest it was trained for).
///
/// # Errors
/// Not a JSON object, an unknown `model_type`, or a field missing, of the wrong type or
/// out of range, named.
pub fn spec(text: &str, sequence: u64) -> Result<GptSpec, ModelError> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| ModelError::Spec(format!("not a JSON configuration: {e}")))?;
    let Some(config) = value.as_object() else {
        return Err(ModelError::Spec("not a JSON object".to_owned()));
    };
    let fields = Fields(config);
    let family = fields.string("model_type")?;
    if !FAMILIES.contains(&family.as_str()) {
        return Err(unknown(&family));
    }
    if let Some(act) = fields.optional_string("hidden_act")? {
        if act != "silu" {
            return Err(ModelError::Spec(format!(
                "hidden_act \"{act}\": these families' MLPs are SwiGLU (silu)"
            )));
        }
    }
    let layers = fields.number("num_hidden_layers")?;
    let hidden = fields.number("hidden_size")?;
    let heads = fields.number("num_attention_heads")?;
    // Absent: each configuration class's default.
    let kv_default = match family.as_str() {
        "mistral" | "mixtral" | "gpt_oss" => 8,
        "qwen2" | "qwen3" => 32,
        "qwen3_moe" => 4,
        _ => heads,
    };
    let kv_heads = fields
        .optional_number("num_key_value_heads")?
        .unwrap_or(kv_default);
    let vocabulary = fields.number("vocab_size")?;
    let ffn = fields.number("intermediate_size")?;
    let tied = fields
        .optional_bool("tie_word_embeddings")?
        .unwrap_or(false);
    let base = GptSpec {
        tied,
        ..GptSpec::llama(layers, hidden, heads, kv_heads, ffn, sequence, vocabulary)
    };
    let head_dim = fields
        .optional_number("head_dim")?
        .unwrap_or(hidden / heads.max(1));
    let attention_bias = fields.optional_bool("attention_bias")?;
    let spec = match family.as_str() {
        "llama" | "mistral" => {
            let mlp_bias = fields.optional_bool("mlp_bias")?.unwrap_or(false);
            let attention_bias = attention_bias.unwrap_or(false);
            if attention_bias != mlp_bias {
                return Err(ModelError::Spec(format!(
                    "attention_bias {attention_bias} with mlp_bias {mlp_bias}: biases on some \
                     dense layers only are not modelled"
                )));
            }
            GptSpec {
                head_dim,
                biases: attention_bias,
                ..base
            }
        }
        // Qwen2's Q, K and V projections carry biases, its output projection and MLP none
        // (`Qwen2Attention`).
        "qwen2" => GptSpec {
            head_dim,
            qkv_bias: true,
            ..base
        },
        "qwen3" => GptSpec {
            head_dim: fields.optional_number("head_dim")?.unwrap_or(128),
            qk_norm: true,
            biases: attention_bias.unwrap_or(false),
            ..base
        },
        "mixtral" => GptSpec {
            head_dim,
            moe: Some(MoeSpec {
                experts: fields.optional_number("num_local_experts")?.unwrap_or(8),
                top_k: fields.optional_number("num_experts_per_tok")?.unwrap_or(2),
                expert_ffn: ffn,
                shared_ffn: 0,
                dense_layers: 0,
                router: Router::Softmax,
                groups: 0,
                top_groups: 0,
            }),
            ..base
        },
        "qwen3_moe" => {
            // Dense blocks only where `mlp_only_layers` or `decoder_sparse_step` put them.
            if fields.optional_number("decoder_sparse_step")?.unwrap_or(1) != 1
                || fields
                    .0
                    .get("mlp_only_layers")
                    .and_then(Value::as_array)
                    .is_some_and(|a| !a.is_empty())
            {
                return Err(ModelError::Spec(
                    "decoder_sparse_step / mlp_only_layers: dense blocks between expert blocks \
                     are not modelled (only leading ones)"
                        .to_owned(),
                ));
            }
            GptSpec {
                head_dim,
                qk_norm: true,
                biases: attention_bias.unwrap_or(false),
                moe: Some(MoeSpec {
                    // transformers 5 saves `num_experts` as `num_local_experts`.
                    experts: fields
                        .optional_number("num_experts")?
                        .or(fields.optional_number("num_local_experts")?)
                        .unwrap_or(128),
                    top_k: fields.optional_number("num_experts_per_tok")?.unwrap_or(8),
                    expert_ffn: fields
                        .optional_number("moe_intermediate_size")?
                        .unwrap_or(768),
                    shared_ffn: 0,
                    dense_layers: 0,
                    router: Router::Softmax,
                    groups: 0,
                    top_groups: 0,
                }),
                ..base
            }
        }
        "deepseek_v3" => {
            let expert_ffn = fields
                .optional_number("moe_intermediate_size")?
                .unwrap_or(2048);
            let nope_dim = fields.optional_number("qk_nope_head_dim")?.unwrap_or(128);
            let rope_dim = fields.optional_number("qk_rope_head_dim")?.unwrap_or(64);
            let shared = fields.optional_count("n_shared_experts")?.unwrap_or(1);
            GptSpec {
                head_dim: nope_dim.saturating_add(rope_dim),
                // Latent attention has no key/value groups.
                kv_heads: heads,
                latent: Some(LatentAttention {
                    // Absent: DeepseekV3Config's 1,536 (null: queries projected directly).
                    q_rank: match fields.0.get("q_lora_rank") {
                        None => 1536,
                        Some(_) => fields.optional_count("q_lora_rank")?.unwrap_or(0),
                    },
                    kv_rank: fields.optional_number("kv_lora_rank")?.unwrap_or(512),
                    rope_dim,
                    nope_dim,
                    v_dim: fields.optional_number("v_head_dim")?.unwrap_or(128),
                }),
                moe: Some(MoeSpec {
                    experts: fields.optional_number("n_routed_experts")?.unwrap_or(256),
                    top_k: fields.optional_number("num_experts_per_tok")?.unwrap_or(8),
                    expert_ffn,
                    shared_ffn: shared.saturating_mul(expert_ffn),
                    dense_layers: fields.optional_count("first_k_dense_replace")?.unwrap_or(3),
                    router: Router::Sigmoid,
                    // DeepseekV3Config's defaults: 8 groups, 4 chosen; one group is none.
                    groups: match fields.optional_number("n_group")?.unwrap_or(8) {
                        1 => 0,
                        g => g,
                    },
                    top_groups: match fields.optional_number("n_group")?.unwrap_or(8) {
                        1 => 0,
                        _ => fields.optional_number("topk_group")?.unwrap_or(4),
                    },
                }),
                ..base
            }
        }
        "gpt_oss" => {
            // Sliding windows on alternate blocks (`layer_types`' default), the first of each
            // pair; other patterns are not modelled.
            let alternate = match fields.0.get("layer_types").and_then(Value::as_array) {
                None => true,
                Some(types) => types.iter().enumerate().all(|(i, t)| {
                    t.as_str()
                        == Some(if i % 2 == 0 {
                            "sliding_attention"
                        } else {
                            "full_attention"
                        })
                }),
            };
            if !alternate {
                return Err(ModelError::Spec(
                    "layer_types: only alternate sliding and full attention blocks \
                            are modelled"
                        .to_owned(),
                ));
            }
            GptSpec {
                head_dim: fields.optional_number("head_dim")?.unwrap_or(64),
                biases: attention_bias.unwrap_or(true),
                sliding_window: fields.optional_number("sliding_window")?.unwrap_or(128),
                moe: Some(MoeSpec {
                    experts: fields.optional_number("num_local_experts")?.unwrap_or(128),
                    top_k: fields
                        .optional_number("num_experts_per_tok")?
                        .or(fields.optional_number("experts_per_token")?)
                        .unwrap_or(4),
                    expert_ffn: ffn,
                    shared_ffn: 0,
                    dense_layers: 0,
                    router: Router::Softmax,
                    groups: 0,
                    top_groups: 0,
                }),
                ..base
            }
        }
        other => return Err(unknown(other)),
    };
    // A window on every block (Mistral 7B v0.1, windowed Qwen) shortens every attention;
    // within the window it changes nothing.
    if matches!(
        family.as_str(),
        "mistral" | "mixtral" | "qwen2" | "qwen3" | "qwen3_moe"
    ) {
        // Qwen windows only the blocks from `max_window_layers` on.
        let windowed = match family.as_str() {
            "mistral" | "mixtral" => true,
            _ => {
                fields.optional_bool("use_sliding_window")?.unwrap_or(false)
                    && fields.optional_count("max_window_layers")?.unwrap_or(28) < layers
            }
        };
        // Absent: MistralConfig's 4,096 (null: none).
        let window = match (family.as_str(), fields.0.get("sliding_window")) {
            ("mistral", None) => Some(4096),
            _ => fields.optional_number("sliding_window")?,
        };
        if let Some(w) = window.filter(|_| windowed) {
            if w < sequence {
                return Err(ModelError::Spec(format!(
                    "sliding_window {w} on every block, shorter than the sequence {sequence}: \
                     not modelled (plan at a sequence within the window)"
                )));
            }
        }
    }
    spec.validate()?;
    Ok(spec)
}

/// Why a `model_type` is not read.
fn unknown(family: &str) -> ModelError {
    ModelError::Spec(format!(
        "model_type \"{family}\" is not a decoder ralpc reads (it reads {})",
        FAMILIES.join(", ")
    ))
}

/// A configuration's fields, read with their names in the errors.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn number(&self, key: &str) -> Result<u64, ModelError> {
        self.optional_number(key)?
            .ok_or_else(|| ModelError::Spec(format!("{key}: missing")))
    }

    /// A positive integer, or `None` where absent or null.
    fn optional_number(&self, key: &str) -> Result<Option<u64>, ModelError> {
        match self.optional_count(key)? {
            Some(0) => Err(ModelError::Spec(format!(
                "{key}: 0 is not a positive integer"
            ))),
            n => Ok(n),
        }
    }

    /// A whole number (0 allowed), or `None` where absent or null.
    fn optional_count(&self, key: &str) -> Result<Option<u64>, ModelError> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| ModelError::Spec(format!("{key}: {v} is not a whole number"))),
        }
    }

    fn optional_bool(&self, key: &str) -> Result<Option<bool>, ModelError> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(ModelError::Spec(format!("{key}: {v} is not true or false"))),
        }
    }

    fn string(&self, key: &str) -> Result<String, ModelError> {
        self.optional_string(key)?
            .ok_or_else(|| ModelError::Spec(format!("{key}: missing")))
    }

    fn optional_string(&self, key: &str) -> Result<Option<String>, ModelError> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(ModelError::Spec(format!("{key}: {v} is not a string"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fixture's configuration (`fixtures/configs/`, see SOURCE.md there).
    fn fixture(name: &str) -> &'static str {
        match name {
            "deepseek-v3" => include_str!("../../../fixtures/configs/deepseek-v3.json"),
            "qwen3-235b-a22b" => include_str!("../../../fixtures/configs/qwen3-235b-a22b.json"),
            "qwen3-30b-a3b" => include_str!("../../../fixtures/configs/qwen3-30b-a3b.json"),
            "gpt-oss-120b" => include_str!("../../../fixtures/configs/gpt-oss-120b.json"),
            "mixtral-8x7b" => include_str!("../../../fixtures/configs/mixtral-8x7b.json"),
            "llama-3.1-8b" => include_str!("../../../fixtures/configs/llama-3.1-8b.json"),
            "qwen2.5-7b" => include_str!("../../../fixtures/configs/qwen2.5-7b.json"),
            "qwen3-8b" => include_str!("../../../fixtures/configs/qwen3-8b.json"),
            "mistral-7b-v0.3" => include_str!("../../../fixtures/configs/mistral-7b-v0.3.json"),
            other => panic!("no fixture {other}"),
        }
    }

    #[test]
    fn parameter_counts_are_the_published_totals() {
        // The model cards' totals and active counts (SOURCE.md), in billions, with the
        // rounding each publishes: (total, active, within).
        let billions = |n: u64| n as f64 / 1e9;
        for (name, total, active, within) in [
            ("deepseek-v3", 671.0, Some(37.0), 0.6),
            ("qwen3-235b-a22b", 235.0, Some(22.0), 0.6),
            // 3.35 B active, published as "3.3B".
            ("qwen3-30b-a3b", 30.5, Some(3.3), 0.06),
            ("mixtral-8x7b", 46.7, Some(12.9), 0.05),
            ("llama-3.1-8b", 8.03, None, 0.005),
            ("qwen2.5-7b", 7.61, None, 0.01),
            ("qwen3-8b", 8.2, None, 0.05),
            ("mistral-7b-v0.3", 7.25, None, 0.005),
        ] {
            let spec = spec(fixture(name), 4096).expect(name);
            let t = billions(spec.params());
            assert!((t - total).abs() <= within, "{name}: {t} B");
            if let Some(active) = active {
                let a = billions(spec.active_params());
                assert!((a - active).abs() <= within, "{name}: {a} B active");
            }
        }
        // OpenAI's active count leaves out the embedding table.
        let gpt_oss = spec(fixture("gpt-oss-120b"), 4096).expect("gpt-oss");
        let embedding = billions(gpt_oss.embedding_params());
        assert!((billions(gpt_oss.params()) - 116.83).abs() < 0.01);
        assert!((billions(gpt_oss.active_params()) - embedding - 5.13).abs() < 0.01);
    }

    #[test]
    fn families_read_their_own_fields() {
        let deepseek = spec(fixture("deepseek-v3"), 4096).expect("reads");
        let moe = deepseek.moe.expect("experts");
        assert_eq!((moe.experts, moe.top_k, moe.dense_layers), (256, 8, 3));
        assert_eq!((moe.shared_ffn, moe.router), (2048, Router::Sigmoid));
        // Node-limited routing: a token's 8 experts from its 4 best of 8 groups.
        assert_eq!((moe.groups, moe.top_groups), (8, 4));
        let grouped = |n_group: u64, topk_group: u64| {
            let text = fixture("deepseek-v3")
                .replace("\"n_group\": 8", &format!("\"n_group\": {n_group}"))
                .replace(
                    "\"topk_group\": 4",
                    &format!("\"topk_group\": {topk_group}"),
                );
            spec(&text, 4096)
        };
        assert_eq!(
            grouped(1, 1).expect("one group").moe.map(|m| m.groups),
            Some(0)
        );
        assert!(grouped(8, 9)
            .unwrap_err()
            .to_string()
            .contains("expert groups"));
        assert!(grouped(7, 4)
            .unwrap_err()
            .to_string()
            .contains("do not divide"));
        // One group of 32 experts holds a token's 8.
        assert!(grouped(8, 1).is_ok());
        assert_eq!(
            deepseek.latent.map(|l| (l.q_rank, l.kv_rank)),
            Some((1536, 512))
        );
        let qwen3 = spec(fixture("qwen3-8b"), 2048).expect("reads");
        assert!(qwen3.qk_norm && qwen3.head_dim == 128 && qwen3.sequence == 2048);
        let qwen2 = spec(fixture("qwen2.5-7b"), 4096).expect("reads");
        assert!(qwen2.qkv_bias && !qwen2.biases);
        let gpt_oss = spec(fixture("gpt-oss-120b"), 4096).expect("reads");
        assert_eq!((gpt_oss.sliding_window, gpt_oss.biases), (128, true));
        assert!(is_config(fixture("mixtral-8x7b")));
        // transformers 5 saves Qwen3-MoE's expert count as `num_local_experts`.
        let saved = fixture("qwen3-30b-a3b").replace("\"num_experts\"", "\"num_local_experts\"");
        let saved = saved.replace(": 128,", ": 160,");
        assert_eq!(
            spec(&saved, 4096).expect("reads").moe.map(|m| m.experts),
            Some(160)
        );
        assert!(!is_config("{\"layers\": 3}") && !is_config("not json"));
    }

    #[test]
    fn bad_configurations_name_the_field() {
        let err = |text: &str| spec(text, 4096).unwrap_err().to_string();
        assert!(err("[]").contains("not a JSON object"));
        assert!(err(r#"{"model_type": "bert"}"#).contains("model_type \"bert\""));
        let llama = fixture("llama-3.1-8b");
        let without = llama.replace("\"hidden_size\": 4096,", "");
        assert!(err(&without).contains("hidden_size: missing"));
        let negative = llama.replace("\"num_hidden_layers\": 32", "\"num_hidden_layers\": -3");
        assert!(err(&negative).contains("num_hidden_layers: -3"));
        let gelu = llama.replace("\"silu\"", "\"gelu\"");
        assert!(err(&gelu).contains("hidden_act"));
        let heads = llama.replace("\"num_key_value_heads\": 8", "\"num_key_value_heads\": 5");
        assert!(err(&heads).contains("kv_heads 5"));
        let wide = llama.replace("\"hidden_size\": 4096", "\"hidden_size\": 1000000000000");
        assert!(err(&wide).contains("hidden 1000000000000 is above"));
        // Within the bounds every count fits; past them in all, the sum is refused.
        let huge = fixture("qwen3-30b-a3b")
            .replace("\"num_hidden_layers\": 48", "\"num_hidden_layers\": 16384")
            .replace("\"hidden_size\": 2048", "\"hidden_size\": 1048576")
            .replace(
                "\"moe_intermediate_size\": 768",
                "\"moe_intermediate_size\": 4194304",
            )
            .replace("\"num_experts\": 128", "\"num_experts\": 16384");
        assert!(err(&huge).contains("overflows 64 bits"), "{}", err(&huge));
        let windowed = fixture("mistral-7b-v0.3")
            .replace("\"sliding_window\": null", "\"sliding_window\": 1024");
        assert!(err(&windowed).contains("sliding_window 1024"));
    }
}
