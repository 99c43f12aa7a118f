//! Rotary position embedding (RoPE, base 10,000, cached length 2048; App. A).
//!
//! Burn's `nn::RotaryEncoding` builds its frequencies from an `f32` base, which limits an f64
//! backend to f32 accuracy; this table is computed in f64 on the host and stored in the backend's
//! float type. The pairing is Burn's and the RoFormer paper's interleaved one: dimensions
//! `(2i, 2i+1)` of each head rotate together by `pos · base^(−2i/d_h)` (docs/decisions.md, decision
//! 5).

use crate::ops::HaaresBackend;
use burn::module::Module;
use burn::tensor::{Tensor, TensorData, backend::Backend};

/// Cached cosines and sines of every position and frequency, and the pair rotation (constants,
/// not parameters).
#[derive(Module, Debug)]
pub struct RotaryTable<B: Backend> {
    /// `cos(pos · θ_i)` at both dimensions `2i, 2i+1` of pair `i` of every head, shape
    /// `[max_seq_len, heads · d_h]`.
    pub cos: Tensor<B, 2>,
    /// `sin(pos · θ_i)`, laid out as `cos`.
    pub sin: Tensor<B, 2>,
    /// `P` with `x P = (−x₁, x₀, −x₃, x₂, …)`, shape `[d_h, d_h]`.
    pub quarter_turn: Tensor<B, 2>,
}

impl<B: Backend> RotaryTable<B> {
    /// The table for `heads` heads of width `head_dim` (even) over `max_seq_len` positions.
    /// Every position's angles are stored once per head, so that [`apply`](Self::apply) reads
    /// one contiguous row instead of repeating the table at every call.
    pub fn new(
        head_dim: usize,
        heads: usize,
        max_seq_len: usize,
        base: f64,
        device: &B::Device,
    ) -> Self {
        let width = heads * head_dim;
        let angles: Vec<f64> = (0..max_seq_len)
            .flat_map(|pos| {
                (0..width).map(move |column| {
                    let pair = (column % head_dim / 2) as f64;
                    pos as f64 * base.powf(-2.0 * pair / head_dim as f64)
                })
            })
            .collect();
        let table = |f: fn(f64) -> f64| {
            let values: Vec<f64> = angles.iter().map(|&angle| f(angle)).collect();
            Tensor::from_data(TensorData::new(values, [max_seq_len, width]), device)
        };
        let mut turn = vec![0.0f64; head_dim * head_dim];
        for pair in 0..head_dim / 2 {
            let (even, odd) = (2 * pair, 2 * pair + 1);
            turn[odd * head_dim + even] = -1.0; // output 2i takes −x_{2i+1}
            turn[even * head_dim + odd] = 1.0; // output 2i+1 takes x_{2i}
        }
        Self {
            cos: table(f64::cos),
            sin: table(f64::sin),
            quarter_turn: Tensor::from_data(TensorData::new(turn, [head_dim, head_dim]), device),
        }
    }

    /// The cosines, the sines and the quarter turn, as the rotary operations take them.
    pub fn tables(&self) -> (Tensor<B, 2>, Tensor<B, 2>, Tensor<B, 2>) {
        (
            self.cos.clone(),
            self.sin.clone(),
            self.quarter_turn.clone(),
        )
    }
}

impl<B: HaaresBackend> RotaryTable<B> {
    /// Rotates each interleaved pair `(x_{2i}, x_{2i+1})` by the angle of its position, then
    /// scales: `s (x ⊙ cos + (x P) ⊙ sin)`, where `x P` turns every pair a quarter turn, as one
    /// operation ([`RotaryBackend::rotary`](crate::ops::RotaryBackend::rotary): one kernel per
    /// direction on the cube backends). `scale` carries attention's `1/√d_h` on the queries (1 on
    /// the keys).
    ///
    /// # Shapes
    /// - x: `[batch, seq, heads, d_h]` with `seq ≤ max_seq_len` and the table's heads and `d_h`
    /// - output: `[batch, seq, heads, d_h]`
    pub fn apply(&self, x: Tensor<B, 4>, scale: f64) -> Tensor<B, 4> {
        let (cos, sin, quarter_turn) = self.tables();
        B::rotary(x, cos, sin, quarter_turn, scale)
    }
}
