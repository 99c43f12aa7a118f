//! What every fast path of the update (`flex.rs`, `cube.rs`) is tested for: the reference's bits,
//! and leaving other backends alone.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use super::rule::{AdamWSettings, Moments, UpdateRule, update_plain};

/// A fast path's signature: the updated parameter, or `None` where it does not apply.
pub(crate) type FastPath<B> =
    fn(&UpdateRule, &Tensor<B, 1>, &Tensor<B, 1>, &mut Moments<B>) -> Option<Tensor<B, 1>>;

/// Values of every size AdamW meets (gradients from 1e-9 to 1e3, both signs, zeros).
fn values(len: usize, seed: f32) -> Vec<f32> {
    (0..len)
        .map(|i| match i % 11 {
            0 => 0.0,
            k => (i as f32 * 0.37 + seed).sin() * 10f32.powi(k as i32 - 9),
        })
        .collect()
}

fn bits<B: Backend>(tensor: &Tensor<B, 1>) -> Vec<u32> {
    let values = tensor.to_data().to_vec::<f32>().expect("an f32 tensor");
    values.iter().map(|x| x.to_bits()).collect()
}

/// Three steps of `len` elements through `fast` and the plain operations from the same start,
/// with decay and without, the second step clipped: the same bits for the parameter and both
/// moments after every step.
pub(crate) fn gives_the_plain_operations_bits<B: Backend>(fast: FastPath<B>, len: usize) {
    let device = Default::default();
    let tensor =
        |values: Vec<f32>| Tensor::<B, 1>::from_data(TensorData::new(values, [len]), &device);
    for decays in [true, false] {
        let settings = AdamWSettings::default();
        let start = values(len, 0.5);
        let zeros = || Moments {
            exp_avg: tensor(vec![0.0; len]),
            exp_avg_sq: tensor(vec![0.0; len]),
        };
        let (mut fused, mut plain) = ((tensor(start.clone()), zeros()), (tensor(start), zeros()));
        for step in 1..=3 {
            let clip = if step == 2 { 0.37 } else { 1.0 };
            let rule = UpdateRule::new(&settings, step, decays).with_clip(clip);
            let grad = tensor(values(len, step as f32));
            let (value, moments) = &mut fused;
            *value = fast(&rule, value, &grad, moments).expect("the backend takes its fast path");
            let (value, moments) = &mut plain;
            *value = update_plain(&rule, value.clone(), grad, moments);
            let what = format!("step {step}, decays {decays}");
            assert_eq!(bits(&fused.0), bits(&plain.0), "parameter, {what}");
            assert_eq!(bits(&fused.1.exp_avg), bits(&plain.1.exp_avg), "m, {what}");
            assert_eq!(
                bits(&fused.1.exp_avg_sq),
                bits(&plain.1.exp_avg_sq),
                "v, {what}"
            );
        }
    }
}

/// `fast` leaves another backend (NdArray) to the plain operations, its moments untouched.
#[cfg(feature = "ndarray")]
pub(crate) fn leaves_other_backends_alone(fast: FastPath<burn::backend::NdArray<f32>>) {
    type Other = burn::backend::NdArray<f32>;
    let device = Default::default();
    let ones = || Tensor::<Other, 1>::ones([4], &device);
    let mut moments = Moments {
        exp_avg: ones(),
        exp_avg_sq: ones(),
    };
    let rule = UpdateRule::new(&AdamWSettings::default(), 1, true);
    assert!(fast(&rule, &ones(), &ones(), &mut moments).is_none());
    assert_eq!(moments.exp_avg.to_data(), ones().to_data());
}
