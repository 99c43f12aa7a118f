//! Tensors to and from `.safetensors` bytes: F32 and F64 written, and F32, F64, F16 and BF16 read
//! (docs/checkpoint-format.md, "Dtype"), each tensor's non-finite values counted as it is read.

use std::collections::HashMap;

use burn::tensor::{DType, TensorData, bf16, f16};
use safetensors::{Dtype, SafeTensors, tensor::TensorView};

use crate::error::{HaaresError, Result};

/// Serialises named tensors (f64 data as F64, anything else as F32) with string metadata as
/// `.safetensors` bytes.
pub fn serialize_named_tensors(
    tensors: Vec<(String, TensorData)>,
    metadata: HashMap<String, String>,
) -> Result<Vec<u8>> {
    let tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = tensors
        .into_iter()
        .map(|(name, data)| {
            let shape = data.shape.to_vec();
            let (dtype, bytes) = if data.dtype == DType::F64 {
                (
                    Dtype::F64,
                    data.iter::<f64>().flat_map(f64::to_le_bytes).collect(),
                )
            } else {
                (
                    Dtype::F32,
                    data.iter::<f32>().flat_map(f32::to_le_bytes).collect(),
                )
            };
            (name, dtype, shape, bytes)
        })
        .collect();
    let views = tensors
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            Ok((
                name.as_str(),
                TensorView::new(*dtype, shape.clone(), bytes).map_err(safetensors_error)?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize(views, Some(metadata)).map_err(safetensors_error)
}

/// Reads every tensor (F32, F64, F16 or BF16; the half types as F32) and the metadata of
/// `.safetensors` bytes.
pub fn deserialize_named_tensors(
    bytes: &[u8],
) -> Result<(HashMap<String, TensorData>, HashMap<String, String>)> {
    let (tensors, metadata) = deserialize_counting_non_finite(bytes)?;
    let tensors = tensors
        .into_iter()
        .map(|(name, decoded)| (name, decoded.data))
        .collect();
    Ok((tensors, metadata))
}

/// One tensor as read from a file.
pub(crate) struct Decoded {
    pub data: TensorData,
    /// How many of its values are NaN or infinite.
    pub non_finite: usize,
}

pub(crate) fn deserialize_counting_non_finite(
    bytes: &[u8],
) -> Result<(HashMap<String, Decoded>, HashMap<String, String>)> {
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(safetensors_error)?;
    let metadata = header.metadata().clone().unwrap_or_default();
    let file = SafeTensors::deserialize(bytes).map_err(safetensors_error)?;
    let mut tensors = HashMap::new();
    for (name, view) in file.iter() {
        tensors.insert(name.to_string(), decode(name, &view)?);
    }
    Ok((tensors, metadata))
}

/// Bytes per value of a dtype this module reads, or an error naming the tensor.
pub(crate) fn readable_width(name: &str, dtype: Dtype) -> Result<usize> {
    match dtype {
        Dtype::F64 => Ok(8),
        Dtype::F32 => Ok(4),
        Dtype::F16 | Dtype::BF16 => Ok(2),
        other => Err(HaaresError::Checkpoint(format!(
            "tensor `{name}` has dtype {other:?}; model files hold F32, F64, F16 or BF16 values \
             (docs/checkpoint-format.md); convert it, e.g. with `tensor.float()` in PyTorch"
        ))),
    }
}

fn decode(name: &str, view: &TensorView<'_>) -> Result<Decoded> {
    let width = readable_width(name, view.dtype())?;
    let shape = view.shape().to_vec();
    let words = view.data().chunks_exact(width);
    let data = match view.dtype() {
        Dtype::F64 => values(words, |b| f64::from_le_bytes(b.try_into().unwrap()), shape),
        Dtype::F32 => values(words, |b| f32::from_le_bytes(b.try_into().unwrap()), shape),
        Dtype::F16 => values(words, |b| f16::from_le_bytes([b[0], b[1]]).to_f32(), shape),
        _ => values(words, |b| bf16::from_le_bytes([b[0], b[1]]).to_f32(), shape),
    };
    let non_finite = match data.dtype {
        DType::F64 => data.iter::<f64>().filter(|v| !v.is_finite()).count(),
        _ => data.iter::<f32>().filter(|v| !v.is_finite()).count(),
    };
    Ok(Decoded { data, non_finite })
}

fn values<'a, E: burn::tensor::Element>(
    words: impl Iterator<Item = &'a [u8]>,
    read: impl Fn(&[u8]) -> E,
    shape: Vec<usize>,
) -> TensorData {
    TensorData::new(words.map(read).collect::<Vec<E>>(), shape)
}

pub(crate) fn safetensors_error(error: safetensors::SafeTensorError) -> HaaresError {
    HaaresError::Checkpoint(format!("invalid safetensors data: {error}"))
}
