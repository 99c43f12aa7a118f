//! The packed projections' joins and splits as one CubeCL kernel each, where Burn's `cat`
//! launches one copy per part and the split weights' gradients one copy each: two or three parts,
//! the backbone's most (other counts take the plain forms). Every kernel takes one thread per
//! element, reads through strides and writes a contiguous output.

use burn::tensor::Tensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::{ProjectionBackend, naive};
use crate::autodiff_node::from_primitive;
use crate::ops::cube_shared::{elementwise, empty_shaped, primitive};

type Cube<R, F, I, BT> = CubeBackend<R, F, I, BT>;
type Matrix<R, F, I, BT> = Tensor<Cube<R, F, I, BT>, 2>;

impl<R, F, I, BT> ProjectionBackend for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn packs_projections() -> bool {
        true
    }

    fn concat_columns(parts: Vec<Tensor<Self, 2>>) -> Tensor<Self, 2> {
        match takes_parts(parts.len()) {
            true => concat_columns(parts),
            false => naive::concat_columns(parts),
        }
    }

    fn split_columns(whole: Tensor<Self, 2>, widths: &[usize]) -> Vec<Tensor<Self, 2>> {
        match takes_parts(widths.len()) {
            true => split_columns(whole, widths),
            false => naive::split_columns(whole, widths),
        }
    }
}

/// Whether the join and split kernels take `parts` parts: two or three, the backbone's most.
fn takes_parts(parts: usize) -> bool {
    (2..=3).contains(&parts)
}

/// [`ProjectionBackend::concat_columns`] in one launch.
fn concat_columns<R, F, I, BT>(parts: Vec<Matrix<R, F, I, BT>>) -> Matrix<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let count = parts.len();
    let parts: Vec<_> = parts.into_iter().map(primitive).collect();
    let rows = parts[0].meta.shape()[0];
    assert!(
        parts.iter().all(|part| part.meta.shape()[0] == rows),
        "concat_columns: the parts' rows differ"
    );
    let total = parts.iter().map(|part| part.meta.shape()[1]).sum();
    let output = empty_shaped(&parts[0], vec![rows, total]);
    let third = parts.get(2).unwrap_or(&parts[0]).clone();
    let (cube_count, cube_dim) = elementwise(&output);
    kernels::concat_columns_kernel::launch::<R>(
        &output.client.clone(),
        cube_count,
        cube_dim,
        parts[0].clone().into_tensor_arg(),
        parts[1].clone().into_tensor_arg(),
        third.into_tensor_arg(),
        output.clone().into_tensor_arg(),
        count == 3,
        output.dtype.into(),
    );
    from_primitive(output)
}

/// [`ProjectionBackend::split_columns`] in one launch.
fn split_columns<R, F, I, BT>(
    whole: Matrix<R, F, I, BT>,
    widths: &[usize],
) -> Vec<Matrix<R, F, I, BT>>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let count = widths.len();
    let whole = primitive(whole);
    let [rows, total] = [whole.meta.shape()[0], whole.meta.shape()[1]];
    assert_eq!(
        widths.iter().sum::<usize>(),
        total,
        "split_columns: widths {widths:?} do not add up to {total} columns"
    );
    let parts: Vec<_> = widths
        .iter()
        .map(|&width| empty_shaped(&whole, vec![rows, width]))
        .collect();
    // Two parts: a one-element stand-in for the third, never written.
    let third = parts
        .get(2)
        .cloned()
        .unwrap_or_else(|| empty_shaped(&whole, vec![1, 1]));
    let (cube_count, cube_dim) = elementwise(&whole);
    kernels::split_columns_kernel::launch::<R>(
        &whole.client.clone(),
        cube_count,
        cube_dim,
        whole.clone().into_tensor_arg(),
        parts[0].clone().into_tensor_arg(),
        parts[1].clone().into_tensor_arg(),
        third.into_tensor_arg(),
        count == 3,
        whole.dtype.into(),
    );
    parts.into_iter().map(from_primitive).collect()
}

/// The kernels, in a module of their own because CubeCL's `Tensor` is not Burn's.
// A kernel's branches assign a value declared before them, as CubeCL's expansion needs.
#[allow(unused_assignments)]
pub(super) mod kernels {
    use burn_cubecl::cubecl;
    use burn_cubecl::cubecl::prelude::*;

    use crate::ops::cube_shared::kernels::at;

    /// `output = [a b c]` (`[a b]` without `three`), one thread per element of `output`.
    #[cube(launch)]
    pub(in crate::ops) fn concat_columns_kernel<F: Float>(
        a: &Tensor<F>,
        b: &Tensor<F>,
        c: &Tensor<F>,
        output: &mut Tensor<F>,
        #[comptime] three: bool,
        #[define(F)] _dtype: StorageType,
    ) {
        if ABSOLUTE_POS >= output.len() {
            terminate!();
        }
        let total = output.shape(1);
        let row = ABSOLUTE_POS / total;
        let column = ABSOLUTE_POS % total;
        let (first, second) = (a.shape(1), a.shape(1) + b.shape(1));
        let mut value = F::new(0.0);
        if column < first {
            value = a[at(a, row, column)];
        } else if column < second || !three {
            value = b[at(b, row, column - first)];
        } else {
            value = c[at(c, row, column - second)];
        }
        output[ABSOLUTE_POS] = value;
    }

    /// `[a b c] = whole` (`[a b]` without `three`), one thread per element of `whole`.
    #[cube(launch)]
    pub(in crate::ops) fn split_columns_kernel<F: Float>(
        whole: &Tensor<F>,
        a: &mut Tensor<F>,
        b: &mut Tensor<F>,
        c: &mut Tensor<F>,
        #[comptime] three: bool,
        #[define(F)] _dtype: StorageType,
    ) {
        let total = whole.shape(1);
        if ABSOLUTE_POS >= whole.shape(0) * total {
            terminate!();
        }
        let row = ABSOLUTE_POS / total;
        let column = ABSOLUTE_POS % total;
        let value = whole[at(whole, row, column)];
        let (first, second) = (a.shape(1), a.shape(1) + b.shape(1));
        if column < first {
            a[row * first + column] = value;
        } else if column < second || !three {
            b[row * b.shape(1) + column - first] = value;
        } else {
            c[row * c.shape(1) + column - second] = value;
        }
    }
}
