//! Rotary position embedding (RoPE, base 10,000, cached length 2048; App. A).
//!
//! Burn's `nn::RotaryEncoding` builds its frequencies from an `f32` base, which limits an f64
//! backend to f32 accuracy; this table is computed in f64 on the host and stored in the backend's
//! float type. The pairing is Burn's and the RoFormer paper's interleaved one: dimensions
//! `(2i, 2i+1)` of each head rotate together by `pos · base^(−2i/d_h)` (NOTES decision 5).

use burn::module::Module;
use burn::tensor::{Tensor, TensorData, backend::Backend};

/// Cached cosines and sines of every position and frequency (constants, not parameters).
#[derive(Module, Debug)]
pub struct RotaryTable<B: Backend> {
    /// `cos(pos · θ_i)`, shape `[max_seq_len, d_h / 2]`.
    pub cos: Tensor<B, 2>,
    /// `sin(pos · θ_i)`, shape `[max_seq_len, d_h / 2]`.
    pub sin: Tensor<B, 2>,
}

impl<B: Backend> RotaryTable<B> {
    /// The table for heads of width `head_dim` (even) over `max_seq_len` positions.
    pub fn new(head_dim: usize, max_seq_len: usize, base: f64, device: &B::Device) -> Self {
        let pairs = head_dim / 2;
        let angles: Vec<f64> = (0..max_seq_len)
            .flat_map(|pos| {
                (0..pairs).map(move |i| pos as f64 * base.powf(-2.0 * i as f64 / head_dim as f64))
            })
            .collect();
        let table = |f: fn(f64) -> f64| {
            let values: Vec<f64> = angles.iter().map(|&angle| f(angle)).collect();
            Tensor::from_data(TensorData::new(values, [max_seq_len, pairs]), device)
        };
        Self {
            cos: table(f64::cos),
            sin: table(f64::sin),
        }
    }

    /// Rotates each interleaved pair `(x_{2i}, x_{2i+1})` by the angle of its position.
    ///
    /// # Shapes
    /// - x: `[batch, heads, seq, d_h]` with `seq ≤ max_seq_len`
    /// - output: `[batch, heads, seq, d_h]`
    pub fn apply(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let [batch, heads, seq, head_dim] = x.dims();
        let pairs = x.reshape([batch, heads, seq, head_dim / 2, 2]);
        let even = pairs.clone().narrow(4, 0, 1);
        let odd = pairs.narrow(4, 1, 1);
        let cos: Tensor<B, 5> =
            self.cos
                .clone()
                .narrow(0, 0, seq)
                .reshape([1, 1, seq, head_dim / 2, 1]);
        let sin: Tensor<B, 5> =
            self.sin
                .clone()
                .narrow(0, 0, seq)
                .reshape([1, 1, seq, head_dim / 2, 1]);
        let rotated_even = even.clone() * cos.clone() - odd.clone() * sin.clone();
        let rotated_odd = even * sin + odd * cos;
        Tensor::cat(vec![rotated_even, rotated_odd], 4).reshape([batch, heads, seq, head_dim])
    }
}
