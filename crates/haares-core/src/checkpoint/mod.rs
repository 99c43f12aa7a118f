//! Checkpoint interop: every parameter under a PyTorch-convention name and layout, saved as
//! `.safetensors` with the model config as JSON metadata (see `docs/checkpoint-format.md`).
//!
//! Burn's `Linear` stores its weight as `[d_in, d_out]`; PyTorch's as `[out, in]`. Linear weights
//! are transposed on the way out and back on the way in, so a PyTorch user can load the file with
//! `safetensors.torch.load_file` and use `x @ W.T` as usual.
//!
//! A model file is untrusted input: its header is checked against the config in its metadata
//! ([`layout`]) before any model is allocated, and its values are checked for NaN and infinity
//! as they are read ([`LoadOptions`]).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use burn::module::Param;
use burn::tensor::{Element, Tensor, TensorData, backend::Backend};
use safetensors::SafeTensors;

use crate::config::ModelConfig;
use crate::error::{HaaresError, Result};
use crate::model::HaaresModel;

mod decode;
pub mod layout;

use decode::{Decoded, deserialize_counting_non_finite, readable_width, safetensors_error};
pub use decode::{deserialize_named_tensors, serialize_named_tensors};
pub use layout::check_layout;

/// Metadata key holding the model config as JSON.
pub const CONFIG_METADATA_KEY: &str = "haares_config";

/// Walks every trainable parameter of a model with its checkpoint name (see
/// [`HaaresModel::visit_named_params`]); optimizers and exporters implement it.
pub trait ParamVisitor<B: Backend> {
    /// A vector parameter (norm weights, router queries, detail biases, gates, scales).
    fn vector(&mut self, name: String, param: &mut Param<Tensor<B, 1>>);
    /// A Linear weight: Burn `[d_in, d_out]`, checkpoint `[out, in]`.
    fn linear(&mut self, name: String, param: &mut Param<Tensor<B, 2>>);
    /// A matrix stored in the same layout in both (the embedding).
    fn matrix(&mut self, name: String, param: &mut Param<Tensor<B, 2>>);
}

fn visit_params<B: Backend>(model: &mut HaaresModel<B>, visitor: &mut impl ParamVisitor<B>) {
    visitor.matrix("embed.weight".into(), &mut model.embed.weight);
    visitor.vector("final_norm.weight".into(), &mut model.final_norm.weight);
    for (i, layer) in model.layers.iter_mut().enumerate() {
        let name = |suffix: &str| format!("layers.{i}.{suffix}");
        visitor.vector(name("attn_norm.weight"), &mut layer.attn_norm.weight);
        visitor.vector(name("mlp_norm.weight"), &mut layer.mlp_norm.weight);
        visitor.linear(name("attn.wq.weight"), &mut layer.attn.wq.weight);
        visitor.linear(name("attn.wk.weight"), &mut layer.attn.wk.weight);
        visitor.linear(name("attn.wv.weight"), &mut layer.attn.wv.weight);
        visitor.linear(name("attn.wo.weight"), &mut layer.attn.wo.weight);
        visitor.linear(name("mlp.w_gate.weight"), &mut layer.mlp.w_gate.weight);
        visitor.linear(name("mlp.w_up.weight"), &mut layer.mlp.w_up.weight);
        visitor.linear(name("mlp.w_down.weight"), &mut layer.mlp.w_down.weight);
        // The stream keeps its parameters by event; a file keeps them under their layer, event
        // 2i as `attn_…`, 2i + 1 as `mlp_…` (the names of docs/checkpoint-format.md).
        let stream = &mut model.stream;
        let events = [(2 * i, "attn"), (2 * i + 1, "mlp")];
        for (event, sublayer) in events {
            if let Some(router) = stream.routers_mut().get_mut(event) {
                let site = format!("{sublayer}_router");
                visitor.vector(name(&format!("{site}.query")), &mut router.query);
                visitor.vector(
                    name(&format!("{site}.key_norm.weight")),
                    &mut router.key_norm.weight,
                );
                if let Some(bias) = &mut router.detail_bias {
                    visitor.vector(name(&format!("{site}.detail_bias")), bias);
                }
            }
        }
        let mut per_event = |params: &mut [Param<Tensor<B, 1>>], kind: &str| {
            for (event, sublayer) in events {
                if let Some(param) = params.get_mut(event) {
                    visitor.vector(name(&format!("{sublayer}_{kind}")), param);
                }
            }
        };
        per_event(stream.gates_mut(), "gate");
        per_event(stream.scales_mut(), "scale");
    }
    if let Some(router) = model.stream.final_router_mut() {
        visitor.vector("final_router.query".into(), &mut router.query);
        visitor.vector(
            "final_router.key_norm.weight".into(),
            &mut router.key_norm.weight,
        );
    }
}

struct Exporter(Vec<(String, TensorData)>);

impl<B: Backend> ParamVisitor<B> for Exporter {
    fn vector(&mut self, name: String, param: &mut Param<Tensor<B, 1>>) {
        self.0.push((name, param.val().into_data()));
    }
    fn linear(&mut self, name: String, param: &mut Param<Tensor<B, 2>>) {
        self.0.push((name, param.val().transpose().into_data()));
    }
    fn matrix(&mut self, name: String, param: &mut Param<Tensor<B, 2>>) {
        self.0.push((name, param.val().into_data()));
    }
}

struct ShapeCollector(BTreeMap<String, Vec<usize>>);

impl<B: Backend> ParamVisitor<B> for ShapeCollector {
    fn vector(&mut self, name: String, param: &mut Param<Tensor<B, 1>>) {
        self.0.insert(name, param.lazy_shape().to_vec());
    }
    fn linear(&mut self, name: String, param: &mut Param<Tensor<B, 2>>) {
        let [d_in, d_out] = param.lazy_shape().dims::<2>();
        self.0.insert(name, vec![d_out, d_in]);
    }
    fn matrix(&mut self, name: String, param: &mut Param<Tensor<B, 2>>) {
        self.0.insert(name, param.lazy_shape().to_vec());
    }
}

struct Importer<'a, B: Backend> {
    tensors: HashMap<String, TensorData>,
    device: &'a B::Device,
    error: Option<HaaresError>,
}

impl<B: Backend> Importer<'_, B> {
    fn take<const D: usize>(&mut self, name: &str, expected: [usize; D]) -> Option<Tensor<B, D>> {
        if self.error.is_some() {
            return None;
        }
        let Some(data) = self.tensors.remove(name) else {
            self.error = Some(HaaresError::Checkpoint(format!(
                "tensor `{name}` is missing; the checkpoint does not match its own config"
            )));
            return None;
        };
        if data.shape.as_slice() != expected.as_slice() {
            self.error = Some(HaaresError::Checkpoint(format!(
                "tensor `{name}` has shape {:?}, expected {expected:?}",
                data.shape.to_vec()
            )));
            return None;
        }
        Some(Tensor::from_data(data, self.device))
    }
    fn replace<const D: usize>(param: &mut Param<Tensor<B, D>>, value: Tensor<B, D>) {
        *param = Param::initialized(param.id, value.require_grad());
    }
}

impl<B: Backend> ParamVisitor<B> for Importer<'_, B> {
    fn vector(&mut self, name: String, param: &mut Param<Tensor<B, 1>>) {
        if let Some(value) = self.take(&name, param.lazy_shape().dims::<1>()) {
            Self::replace(param, value);
        }
    }
    fn linear(&mut self, name: String, param: &mut Param<Tensor<B, 2>>) {
        let [d_in, d_out] = param.lazy_shape().dims::<2>();
        if let Some(value) = self.take(&name, [d_out, d_in]) {
            Self::replace(param, value.transpose());
        }
    }
    fn matrix(&mut self, name: String, param: &mut Param<Tensor<B, 2>>) {
        if let Some(value) = self.take(&name, param.lazy_shape().dims::<2>()) {
            Self::replace(param, value);
        }
    }
}

impl<B: Backend> HaaresModel<B> {
    /// Visits every trainable parameter under its checkpoint name, in a fixed order (embedding,
    /// final norm, layers in order, final router); the visitor may replace a parameter's value.
    pub fn visit_named_params(&mut self, visitor: &mut impl ParamVisitor<B>) {
        visit_params(self, visitor);
    }

    /// Every parameter under its checkpoint name, in PyTorch layout (Linear weights `[out, in]`),
    /// in a fixed order: embedding, final norm, layers in order, final router.
    pub fn to_named_tensors(&self) -> Vec<(String, TensorData)> {
        let mut exporter = Exporter(Vec::new());
        visit_params(&mut self.clone(), &mut exporter);
        exporter.0
    }

    /// Builds a model of `config` from named tensors in checkpoint layout. Every expected name must
    /// be present with its exact shape, and no other name may be: a mismatch is an error naming
    /// the tensor, found before the model is allocated ([`check_layout`]).
    pub fn from_named_tensors(
        config: &ModelConfig,
        tensors: HashMap<String, TensorData>,
        device: &B::Device,
    ) -> Result<Self> {
        config.validate()?;
        let shapes = tensors
            .iter()
            .map(|(name, data)| (name.as_str(), data.shape.as_slice()))
            .collect();
        let width = tensors.values().next().map_or(4, |data| data.dtype.size());
        check_layout(config, &shapes, width)?;
        let mut model = config.init_lazy::<B>(device)?;
        let float = <B::FloatElem as Element>::dtype();
        let tensors = tensors
            .into_iter()
            .map(|(name, data)| (name, data.convert_dtype(float)))
            .collect();
        let mut importer = Importer {
            tensors,
            device,
            error: None,
        };
        visit_params(&mut model, &mut importer);
        match importer.error {
            Some(error) => Err(error),
            None => Ok(model),
        }
    }

    /// Serialises the model as `.safetensors` bytes (f64 backends as F64, others as F32), with the
    /// config under the metadata key [`CONFIG_METADATA_KEY`].
    pub fn to_safetensors_bytes(&self) -> Result<Vec<u8>> {
        let config = serde_json::to_string(&self.config)
            .map_err(|e| HaaresError::Checkpoint(format!("cannot serialise the config: {e}")))?;
        let metadata = HashMap::from([
            (CONFIG_METADATA_KEY.to_string(), config),
            ("format".to_string(), "haares".to_string()),
        ]);
        serialize_named_tensors(self.to_named_tensors(), metadata)
    }

    /// Rebuilds a model from `.safetensors` bytes written by
    /// [`to_safetensors_bytes`](Self::to_safetensors_bytes) (or by any tool that uses the same
    /// names, layouts and config metadata), refusing non-finite values
    /// ([`from_safetensors_bytes_with`](Self::from_safetensors_bytes_with) with the default
    /// [`LoadOptions`]).
    pub fn from_safetensors_bytes(bytes: &[u8], device: &B::Device) -> Result<Self> {
        Self::from_safetensors_bytes_with(bytes, device, LoadOptions::default())
    }

    /// [`from_safetensors_bytes`](Self::from_safetensors_bytes) with `options`. The header is
    /// read first, without the tensor data: the config in its metadata is validated (its sizes
    /// within [`crate::limits`]) and checked against every tensor's name, shape and dtype
    /// ([`check_layout`]); only then are the values read and the model allocated.
    pub fn from_safetensors_bytes_with(
        bytes: &[u8],
        device: &B::Device,
        options: LoadOptions,
    ) -> Result<Self> {
        let (_, header) = SafeTensors::read_metadata(bytes).map_err(safetensors_error)?;
        let config = config_of(header.metadata().as_ref())?;
        let infos = header.tensors();
        let mut names: Vec<&String> = infos.keys().collect();
        names.sort();
        for name in &names {
            readable_width(name, infos[*name].dtype)?;
        }
        // Bytes per value in the messages: the embedding's, the largest tensor of a real model.
        let width = infos
            .get("embed.weight")
            .map_or(Ok(4), |info| readable_width("embed.weight", info.dtype))?;
        let shapes = infos
            .iter()
            .map(|(name, info)| (name.as_str(), info.shape.as_slice()))
            .collect();
        check_layout(&config, &shapes, width)?;
        let (tensors, _) = deserialize_counting_non_finite(bytes)?;
        if !options.allow_non_finite {
            refuse_non_finite(&tensors)?;
        }
        let tensors = tensors
            .into_iter()
            .map(|(name, decoded)| (name, decoded.data))
            .collect();
        Self::from_named_tensors(&config, tensors, device)
    }

    /// Writes the model to `path` atomically: a temporary file beside it is written, flushed and
    /// renamed over `path`, so a crash never leaves a half-written checkpoint.
    pub fn save_safetensors(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bytes = self.to_safetensors_bytes()?;
        haares_base::write_atomically(path, &bytes)
            .map_err(|e| HaaresError::Checkpoint(format!("cannot write {}: {e}", path.display())))
    }

    /// Loads a model saved by [`save_safetensors`](Self::save_safetensors), refusing non-finite
    /// values ([`load_safetensors_with`](Self::load_safetensors_with) with the default
    /// [`LoadOptions`]).
    pub fn load_safetensors(path: impl AsRef<Path>, device: &B::Device) -> Result<Self> {
        Self::load_safetensors_with(path, device, LoadOptions::default())
    }

    /// [`load_safetensors`](Self::load_safetensors) with `options`; what is checked, and when, is
    /// [`from_safetensors_bytes_with`](Self::from_safetensors_bytes_with)'s.
    pub fn load_safetensors_with(
        path: impl AsRef<Path>,
        device: &B::Device,
        options: LoadOptions,
    ) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path)
            .map_err(|e| HaaresError::Checkpoint(format!("cannot read {}: {e}", path.display())))?;
        Self::from_safetensors_bytes_with(&bytes, device, options)
            .map_err(|e| HaaresError::Checkpoint(format!("{}: {e}", path.display())))
    }

    /// The checkpoint names and PyTorch-layout shapes of this model's parameters.
    /// Reads no tensor data: shapes come from the parameters' metadata.
    pub fn checkpoint_shapes(&self) -> BTreeMap<String, Vec<usize>> {
        let mut shapes = ShapeCollector(BTreeMap::new());
        visit_params(&mut self.clone(), &mut shapes);
        shapes.0
    }
}

/// How a model file is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoadOptions {
    /// Load a model whose values include NaN or infinity (it evaluates to NaN). Default: false,
    /// and such a file is an error naming each tensor that holds them and how many.
    pub allow_non_finite: bool,
}

/// The model config in a file's metadata, validated.
fn config_of(metadata: Option<&HashMap<String, String>>) -> Result<ModelConfig> {
    let json = metadata
        .and_then(|m| m.get(CONFIG_METADATA_KEY))
        .ok_or_else(|| {
            HaaresError::Checkpoint(format!(
                "no `{CONFIG_METADATA_KEY}` metadata; this file was not written by haares (see \
             docs/checkpoint-format.md)"
            ))
        })?;
    let config: ModelConfig = serde_json::from_str(json).map_err(|e| {
        HaaresError::Checkpoint(format!(
            "the `{CONFIG_METADATA_KEY}` metadata is not a valid model config: {e}"
        ))
    })?;
    config.validate().map_err(|e| {
        HaaresError::Checkpoint(format!("the `{CONFIG_METADATA_KEY}` metadata: {e}"))
    })?;
    Ok(config)
}

/// Refuses tensors holding NaN or infinity: the error names each (in name order, five at most)
/// with its count.
fn refuse_non_finite(tensors: &HashMap<String, Decoded>) -> Result<()> {
    let mut found: Vec<(&String, &Decoded)> = tensors
        .iter()
        .filter(|(_, decoded)| decoded.non_finite > 0)
        .collect();
    if found.is_empty() {
        return Ok(());
    }
    found.sort_by_key(|(name, _)| *name);
    let listed: Vec<String> = found
        .iter()
        .take(5)
        .map(|(name, decoded)| {
            format!(
                "`{name}` ({} of {} values)",
                decoded.non_finite,
                decoded.data.num_elements()
            )
        })
        .collect();
    let more = match found.len() > 5 {
        true => format!(" and {} more", found.len() - 5),
        false => String::new(),
    };
    Err(HaaresError::Checkpoint(format!(
        "{} tensor(s) hold NaN or infinite values: {}{more}; such a model evaluates to NaN. To \
         load it anyway, set `LoadOptions::allow_non_finite` (`--allow-non-finite` on eval, \
         sample and inspect)",
        found.len(),
        listed.join(", ")
    )))
}
