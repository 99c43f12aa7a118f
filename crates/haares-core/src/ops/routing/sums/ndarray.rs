//! The slot sums on Burn's NdArray backend as loops over its host arrays.
//!
//! The plain primitives ([`naive`](super::naive)) broadcast `[tokens, 1]` columns over `[tokens,
//! d]` rows and take matrix–vector products, which NdArray runs about ten times slower than
//! same-shape elementwise work at these sizes (docs/notebook/routing-operator.md). Here each output
//! row is one pass over one row of each source, read where it lies (strided views included): a dot
//! product for [`row_dots`](SlotSumsBackend::row_dots), a scaled add for
//! [`weighted_sum`](SlotSumsBackend::weighted_sum), a scaled copy for
//! [`scaled_rows`](SlotSumsBackend::scaled_rows). `tests/core/fused.rs` checks them against the
//! plain primitives.

use burn::backend::NdArray;
use burn::backend::ndarray::{NdArrayTensor, SharedArray};
use burn::tensor::{Tensor, TensorPrimitive};
use ndarray::{Array2, ArrayView1, ArrayView2, Axis, Zip};

use super::{SlotSumsBackend, naive};
use crate::ndarray_host::NdArrayFloat;

/// The host arrays behind some tensors, kept alive while they are viewed.
struct Host(Vec<NdArrayTensor>);

impl Host {
    fn of<E: NdArrayFloat>(tensors: impl IntoIterator<Item = Tensor<NdArray<E>, 2>>) -> Self
    where
        NdArrayTensor: From<SharedArray<E>>,
    {
        Self(
            tensors
                .into_iter()
                .map(|tensor| tensor.into_primitive().tensor())
                .collect(),
        )
    }

    /// Every tensor as a 2-D view, or `None` if one is not an `E` matrix (then the plain
    /// primitive runs instead).
    fn views<E: NdArrayFloat>(&self) -> Option<Vec<ArrayView2<'_, E>>> {
        self.0.iter().map(E::view).collect()
    }
}

fn tensor<E: NdArrayFloat>(array: Array2<E>) -> Tensor<NdArray<E>, 2>
where
    NdArrayTensor: From<SharedArray<E>>,
{
    let primitive = NdArrayTensor::from(array.into_dyn().into_shared());
    Tensor::from_primitive(TensorPrimitive::Float(primitive))
}

/// Row `n` of `rows`, or its only row when one row is shared by all tokens.
fn row_for<'a, E>(rows: ArrayView2<'a, E>, token: usize) -> ArrayView1<'a, E> {
    let index = if rows.nrows() == 1 { 0 } else { token };
    rows.index_axis_move(Axis(0), index)
}

impl<E: NdArrayFloat> SlotSumsBackend for NdArray<E>
where
    NdArrayTensor: From<SharedArray<E>>,
{
    fn row_dots(slots: &[Tensor<Self, 2>], rows: Tensor<Self, 2>) -> Tensor<Self, 2> {
        let (host_slots, host_rows) = (Host::of(slots.to_vec()), Host::of([rows.clone()]));
        let (Some(slot_views), Some(row_views)) = (host_slots.views::<E>(), host_rows.views::<E>())
        else {
            return naive::row_dots(slots, rows);
        };
        let tokens = slot_views[0].nrows();
        let mut dots = Array2::zeros((slot_views.len(), tokens));
        for (slot, view) in slot_views.iter().enumerate() {
            for (token, row) in view.rows().into_iter().enumerate() {
                dots[[slot, token]] = row.dot(&row_for(row_views[0], token));
            }
        }
        tensor(dots)
    }

    fn weighted_sum(slots: &[Tensor<Self, 2>], weights: Tensor<Self, 2>) -> Tensor<Self, 2> {
        let (host_slots, host_weights) = (Host::of(slots.to_vec()), Host::of([weights.clone()]));
        let (Some(slot_views), Some(weight_views)) =
            (host_slots.views::<E>(), host_weights.views::<E>())
        else {
            return naive::weighted_sum(slots, weights);
        };
        let shape = slot_views[0].raw_dim();
        if slot_views.iter().any(|view| view.raw_dim() != shape) {
            // Mismatched slots: the plain primitive reports Burn's shape error.
            return naive::weighted_sum(slots, weights);
        }
        let weights = &weight_views[0];
        let mut sum = Array2::zeros(shape);
        for (slot, view) in slot_views.iter().enumerate() {
            for (token, (mut out, row)) in sum.rows_mut().into_iter().zip(view.rows()).enumerate() {
                out.scaled_add(weights[[slot, token]], &row);
            }
        }
        tensor(sum)
    }

    fn scaled_rows(
        columns: Tensor<Self, 2>,
        rows: Tensor<Self, 2>,
        wanted: &[bool],
    ) -> Vec<Option<Tensor<Self, 2>>> {
        let (host_columns, host_rows) = (Host::of([columns.clone()]), Host::of([rows.clone()]));
        let (Some(column_views), Some(row_views)) =
            (host_columns.views::<E>(), host_rows.views::<E>())
        else {
            return naive::scaled_rows(columns, rows, wanted);
        };
        let (columns, rows) = (&column_views[0], &row_views[0]);
        let (tokens, d_model) = (columns.ncols(), rows.ncols());
        (0..columns.nrows())
            .map(|slot| {
                wanted[slot].then(|| {
                    let mut scaled = Array2::zeros((tokens, d_model));
                    for (token, out) in scaled.rows_mut().into_iter().enumerate() {
                        let factor = columns[[slot, token]];
                        Zip::from(out)
                            .and(&row_for(*rows, token))
                            .for_each(|out, &value| *out = factor * value);
                    }
                    tensor(scaled)
                })
            })
            .collect()
    }
}
