//! A plain, loop-based f64 forward pass written from the paper alone (App. A, eq:sublayer,
//! eq:partial, eq:update, eq:rmsmatch, eq:sourceset, eq:routingweights, eq:final), independent of
//! the module code. `reference_tests.rs` checks every method's module against it to 1e-9;
//! `tests/portability.rs` does so in f32 on every backend.

use std::collections::HashMap;

use burn::tensor::TensorData;
use haares_core::accumulator::random_signs;
use haares_core::{DetailBias, DetailSource, ModelConfig, ResidualMethod};

type Rows = Vec<Vec<f64>>;

/// How the reference rounds the operands of the products a backend runs as matrix products
/// (linear layers, attention scores and context, the tied head).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Products {
    /// Exact f64 products.
    Exact,
    /// Operands rounded to TF32 (an f32 with a 10-bit mantissa), as tensor cores read f32.
    Tf32 { truncate: bool },
}

impl Products {
    fn operand(self, x: f64) -> f64 {
        match self {
            // A NaN or infinity passes through, to show in the logits, not to overflow the bits.
            Products::Exact => x,
            Products::Tf32 { .. } if !x.is_finite() => x,
            Products::Tf32 { truncate } => {
                let bits = (x as f32).to_bits();
                let dropped = 0x1FFF;
                let bits = if truncate {
                    bits & !dropped
                } else {
                    // Round to nearest, ties to even, at the 13 dropped mantissa bits.
                    (bits + 0x0FFF + ((bits >> 13) & 1)) & !dropped
                };
                f32::from_bits(bits) as f64
            }
        }
    }

    pub fn dot(self, a: &[f64], b: &[f64]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(x, y)| self.operand(*x) * self.operand(*y))
            .sum()
    }
}

struct Reference<'a> {
    config: &'a ModelConfig,
    params: HashMap<&'a str, Vec<f64>>,
    products: Products,
}

fn rms(x: &[f64]) -> f64 {
    (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64).sqrt()
}

fn add(a: &[f64], b: &[f64], scale: f64) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x + scale * y).collect()
}

impl<'a> Reference<'a> {
    fn new(config: &'a ModelConfig, params: &'a HashMap<String, TensorData>) -> Self {
        let params = params
            .iter()
            .map(|(name, data)| (name.as_str(), data.to_vec::<f64>().unwrap()))
            .collect();
        Self {
            config,
            params,
            products: Products::Exact,
        }
    }

    fn p(&self, name: &str) -> &[f64] {
        self.params
            .get(name)
            .unwrap_or_else(|| panic!("missing {name}"))
    }

    fn rms_norm(&self, x: &[f64], weight: &str) -> Vec<f64> {
        let scale = 1.0
            / (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + self.config.norm_epsilon)
                .sqrt();
        x.iter()
            .zip(self.p(weight))
            .map(|(v, w)| v * scale * w)
            .collect()
    }

    /// `y = W x` with `W` stored `[out, in]` (PyTorch layout).
    fn linear(&self, x: &[f64], weight: &str) -> Vec<f64> {
        let w = self.p(weight);
        w.chunks(x.len())
            .map(|row| self.products.dot(row, x))
            .collect()
    }

    fn rope(&self, x: &mut [f64], pos: usize) {
        let dh = x.len();
        for i in 0..dh / 2 {
            let angle = pos as f64 * self.config.rope_base.powf(-2.0 * i as f64 / dh as f64);
            let (a, b) = (x[2 * i], x[2 * i + 1]);
            x[2 * i] = a * angle.cos() - b * angle.sin();
            x[2 * i + 1] = a * angle.sin() + b * angle.cos();
        }
    }

    fn attention(&self, layer: usize, xs: &Rows) -> Rows {
        let name = |w: &str| format!("layers.{layer}.attn.{w}.weight");
        let (heads, dh) = (self.config.n_heads, self.config.head_dim());
        let project = |w: &str, rotate: bool| -> Rows {
            xs.iter()
                .enumerate()
                .map(|(pos, x)| {
                    let mut y = self.linear(x, &name(w));
                    if rotate {
                        for head in y.chunks_mut(dh) {
                            self.rope(head, pos);
                        }
                    }
                    y
                })
                .collect()
        };
        let (q, k, v) = (
            project("wq", true),
            project("wk", true),
            project("wv", false),
        );
        let mut out = Vec::new();
        for (t, query) in q.iter().enumerate() {
            let mut context = vec![0.0; self.config.d_model];
            for h in 0..heads {
                let range = h * dh..(h + 1) * dh;
                let scores: Vec<f64> = (0..=t)
                    .map(|s| {
                        self.products
                            .dot(&query[range.clone()], &k[s][range.clone()])
                            / (dh as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = exps.iter().sum();
                for (s, e) in exps.iter().enumerate() {
                    let weight = self.products.operand(e / total);
                    for j in range.clone() {
                        context[j] += weight * self.products.operand(v[s][j]);
                    }
                }
            }
            out.push(self.linear(&context, &name("wo")));
        }
        out
    }

    fn mlp(&self, layer: usize, xs: &Rows) -> Rows {
        let name = |w: &str| format!("layers.{layer}.mlp.{w}.weight");
        xs.iter()
            .map(|x| {
                let gate = self.linear(x, &name("w_gate"));
                let up = self.linear(x, &name("w_up"));
                let hidden: Vec<f64> = gate
                    .iter()
                    .zip(&up)
                    .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                    .collect();
                self.linear(&hidden, &name("w_down"))
            })
            .collect()
    }

    /// eq:sublayer: `u = f(Norm(x))`.
    fn sublayer(&self, event: usize, xs: &Rows) -> Rows {
        let layer = event / 2;
        if event.is_multiple_of(2) {
            let normed = xs
                .iter()
                .map(|x| self.rms_norm(x, &format!("layers.{layer}.attn_norm.weight")))
                .collect();
            self.attention(layer, &normed)
        } else {
            let normed = xs
                .iter()
                .map(|x| self.rms_norm(x, &format!("layers.{layer}.mlp_norm.weight")))
                .collect();
            self.mlp(layer, &normed)
        }
    }

    /// eq:routingweights over `(value, is_detail)` slots, position by position.
    fn route(&self, router: &str, slots: &[(Rows, bool)], detail_bias: f64) -> Rows {
        let query = self.p(&format!("{router}.query"));
        (0..slots[0].0.len())
            .map(|t| {
                let scores: Vec<f64> = slots
                    .iter()
                    .map(|(value, is_detail)| {
                        let key = self.rms_norm(&value[t], &format!("{router}.key_norm.weight"));
                        key.iter().zip(query).map(|(a, b)| a * b).sum::<f64>()
                            + if *is_detail { detail_bias } else { 0.0 }
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                slots
                    .iter()
                    .zip(&scores)
                    .fold(vec![0.0; self.config.d_model], |acc, ((value, _), s)| {
                        add(&acc, &value[t], (s - max).exp() / total)
                    })
            })
            .collect()
    }

    fn logits(&self, tokens: &[usize]) -> Vec<f64> {
        let embed = self.p("embed.weight");
        let d = self.config.d_model;
        let embedding: Rows = tokens
            .iter()
            .map(|&t| embed[t * d..(t + 1) * d].to_vec())
            .collect();
        let hidden = match self.config.method {
            ResidualMethod::BlockAttnRes | ResidualMethod::Haares(_) => self.routed(&embedding),
            _ => self.additive(&embedding),
        };
        hidden
            .iter()
            .flat_map(|h| {
                let h = self.rms_norm(h, "final_norm.weight");
                embed
                    .chunks(d)
                    .map(move |row| self.products.dot(row, &h))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn additive(&self, embedding: &Rows) -> Rows {
        let mut hidden = embedding.clone();
        for event in 0..2 * self.config.n_layers {
            let u = self.sublayer(event, &hidden);
            let prefix = format!(
                "layers.{}.{}",
                event / 2,
                if event % 2 == 0 { "attn" } else { "mlp" }
            );
            hidden = hidden
                .iter()
                .zip(&u)
                .map(|(h, u)| match self.config.method {
                    ResidualMethod::ReZero => add(h, u, self.p(&format!("{prefix}_gate"))[0]),
                    ResidualMethod::LayerScale { .. } => h
                        .iter()
                        .zip(u)
                        .zip(self.p(&format!("{prefix}_scale")))
                        .map(|((h, u), s)| h + s * u)
                        .collect(),
                    _ => add(h, u, 1.0),
                })
                .collect();
        }
        hidden
    }

    fn routed(&self, embedding: &Rows) -> Rows {
        let options = self.config.method.haares_options().copied();
        let (events, blocks) = (2 * self.config.n_layers, self.config.blocks);
        let m = events / blocks;
        let k = m.div_ceil(2);
        let random = match options.map(|o| o.detail) {
            Some(DetailSource::RandomSigns { seed }) => Some(random_signs(seed, blocks, m)),
            _ => None,
        };
        let zero = vec![vec![0.0; self.config.d_model]; embedding.len()];
        // The value shown in a detail slot for the raw pair (C, D).
        let detail_value = |c: &Rows, dd: &Rows| -> Option<Rows> {
            let options = options?;
            Some(match options.detail {
                DetailSource::DuplicatedCumulative => c.clone(),
                _ if !options.rms_match => dd.clone(),
                _ => c
                    .iter()
                    .zip(dd)
                    .map(|(c, dd)| {
                        let a = (rms(c) / (rms(dd) + options.rms_epsilon))
                            .clamp(1.0 / options.rms_gamma, options.rms_gamma);
                        dd.iter().map(|v| v * a).collect()
                    })
                    .collect(),
            })
        };
        let mut completed: Vec<(Rows, Option<Rows>)> = Vec::new();
        let (mut c, mut dd) = (zero.clone(), zero.clone());
        for event in 0..events {
            let (n, r) = (event / m, event % m + 1);
            let mut slots = vec![(embedding.clone(), false)];
            for (cc, detail) in completed.iter() {
                slots.push((cc.clone(), false));
                if let Some(detail) = detail {
                    slots.push((detail.clone(), true));
                }
            }
            if r > 1 {
                slots.push((c.clone(), false));
                if let Some(detail) = detail_value(&c, &dd) {
                    slots.push((detail, true));
                }
            }
            let prefix = format!(
                "layers.{}.{}_router",
                event / 2,
                if event % 2 == 0 { "attn" } else { "mlp" }
            );
            let bias = match options.map(|o| o.detail_bias) {
                Some(DetailBias::Learned { .. }) => self.p(&format!("{prefix}.detail_bias"))[0],
                Some(DetailBias::Fixed { value }) => value,
                None => 0.0,
            };
            let u = self.sublayer(event, &self.route(&prefix, &slots, bias));
            let sign = match &random {
                Some(signs) => signs[n][r - 1],
                None if r <= k => 1.0,
                None => -1.0,
            };
            c = c.iter().zip(&u).map(|(c, u)| add(c, u, 1.0)).collect();
            dd = dd.iter().zip(&u).map(|(d, u)| add(d, u, sign)).collect();
            if r == m {
                completed.push((c.clone(), detail_value(&c, &dd)));
                c = zero.clone();
                dd = zero.clone();
            }
        }
        let mut slots = vec![(embedding.clone(), false)];
        slots.extend(completed.into_iter().map(|(c, _)| (c, false)));
        self.route("final_router", &slots, 0.0)
    }
}

/// Reference logits of a batch, flattened `[batch, seq, vocab]`.
pub fn reference_logits(
    config: &ModelConfig,
    params: &HashMap<String, TensorData>,
    tokens: &[Vec<usize>],
) -> Vec<f64> {
    reference_logits_with(config, params, tokens, Products::Exact)
}

/// [`reference_logits`] with the matrix products' operands rounded as `products` says.
pub fn reference_logits_with(
    config: &ModelConfig,
    params: &HashMap<String, TensorData>,
    tokens: &[Vec<usize>],
    products: Products,
) -> Vec<f64> {
    let reference = Reference {
        products,
        ..Reference::new(config, params)
    };
    tokens
        .iter()
        .flat_map(|row| reference.logits(row))
        .collect()
}
