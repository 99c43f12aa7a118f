//! The kernels writing into a row-pitched output, the layout CUDA's allocator gives a
//! `[rows, width]` tensor whose row is not a power-of-two number of bytes (cubecl's
//! `PitchedMemoryLayoutPolicy`). wgpu allocates contiguously, so these tests build the pitched
//! view by hand: its values must be the f64 sums, and its padding must stay untouched.

use burn::backend::wgpu::{CubeBackend, WgpuRuntime};
use burn::tensor::{Shape, Tensor, TensorData};
use burn_cubecl::tensor::CubeTensor;

type Wgpu = CubeBackend<WgpuRuntime, f32, i32, u32>;
const PADDING: f32 = -7.5;

/// Deterministic values in [-1, 1) that differ from slot to slot and element to element.
fn values(seed: usize, count: usize) -> Vec<f32> {
    (0..count)
        .map(|i| (((i * 7919 + seed * 104_729) % 2003) as f32) / 1001.5 - 1.0)
        .collect()
}

fn matrix(seed: usize, rows: usize, width: usize) -> CubeTensor<WgpuRuntime> {
    let data = TensorData::new(values(seed, rows * width), [rows, width]);
    super::cube_tensor(Tensor::<Wgpu, 2>::from_data(data, &Default::default()))
}

/// A `[rows, width]` view with row stride `width + pad` over a buffer filled with
/// [`PADDING`], and the whole buffer.
fn pitched(rows: usize, width: usize, pad: usize) -> (CubeTensor<WgpuRuntime>, Tensor<Wgpu, 2>) {
    let buffer = Tensor::<Wgpu, 2>::full([rows, width + pad], PADDING, &Default::default());
    let mut view = buffer.clone().into_primitive().tensor();
    view.meta.shape = Shape::new([rows, width]);
    (view, buffer)
}

/// Checks the buffer: the view's entries against `expected` (`[rows, width]` row-major),
/// the padding against [`PADDING`].
fn check(buffer: Tensor<Wgpu, 2>, width: usize, expected: &[f64], what: &str) {
    let [_, pitch] = buffer.dims();
    let actual = buffer.into_data().convert::<f32>().to_vec::<f32>().unwrap();
    for (index, value) in actual.iter().enumerate() {
        let (row, column) = (index / pitch, index % pitch);
        let want = match column < width {
            true => expected[row * width + column],
            false => f64::from(PADDING),
        };
        assert!(
            (f64::from(*value) - want).abs() < 1e-4,
            "{what}: element ({row}, {column}) of a pitch-{pitch} output is {value}, want {want}"
        );
    }
}

/// Tokens, width and slots of both tests: rows of 280 bytes, which CUDA pads to 512.
const TOKENS: usize = 37;
const D: usize = 70;
const COUNT: usize = 3;

fn slots() -> Vec<CubeTensor<WgpuRuntime>> {
    (0..COUNT).map(|s| matrix(s, TOKENS, D)).collect()
}

#[test]
#[ignore = "needs a wgpu adapter: cargo test --workspace -- --ignored wgpu"]
fn weighted_sum_writes_a_pitched_output() {
    let (tokens, d, count) = (TOKENS, D, COUNT);
    let slots = slots();
    let weights = matrix(10, count, tokens);
    let (output, buffer) = pitched(tokens, d, 58);
    super::weighted_sum_into(&slots, weights, output);
    let weight = values(10, count * tokens);
    let expected: Vec<f64> = (0..tokens * d)
        .map(|i| {
            (0..count)
                .map(|s| {
                    f64::from(weight[s * tokens + i / d]) * f64::from(values(s, tokens * d)[i])
                })
                .sum()
        })
        .collect();
    check(buffer, d, &expected, "weighted_sum");
}

#[test]
#[ignore = "needs a wgpu adapter: cargo test --workspace -- --ignored wgpu"]
fn row_dots_write_a_pitched_output() {
    let (tokens, d, count) = (TOKENS, D, COUNT);
    let slots = slots();
    let rows = matrix(10, tokens, d);
    let (output, buffer) = pitched(count, tokens, 27);
    super::row_dots_into(&slots, rows, output, 1.0);
    let row = values(10, tokens * d);
    let expected: Vec<f64> = (0..count * tokens)
        .map(|i| {
            let (s, n) = (i / tokens, i % tokens);
            let slot = values(s, tokens * d);
            (0..d)
                .map(|k| f64::from(slot[n * d + k]) * f64::from(row[n * d + k]))
                .sum()
        })
        .collect();
    check(buffer, tokens, &expected, "row_dots");
}
