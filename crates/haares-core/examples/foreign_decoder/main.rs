//! HAARES around sublayers that are not haares's: a decoder of Burn's `MultiHeadAttention`, a
//! GELU MLP and a token shift (three residual events per layer, [`model`]), trained for a few
//! steps on the embedded State of the Union corpus with HAARES and with Block AttnRes from the
//! same initial sublayer weights. Prints the training losses, the validation loss and HAARES's
//! detail share `p_D` (eq:groupmixture) at the read sites that see a detail slot. docs/library.md walks through it.
//!
//! `cargo run -p haares-core --example foreign_decoder -- [--wgpu] [steps] [batch] [seq]`
//! (defaults 40, 8, 64, on Flex; CI runs it with its defaults). `--wgpu` trains on
//! `haares_core::backend::Wgpu` instead (the `wgpu` feature: `--features wgpu`).

mod model;

use std::error::Error;

use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::activation::log_softmax;
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
#[cfg(feature = "wgpu")]
use haares_core::backend::{Wgpu, WgpuDevice};
use haares_core::{ResidualMethod, RoutingTrace, SlotKind, TrainingBackend};
use haares_data::batching::{Batch, BatchIterator, validation_batches};
use haares_data::char_tokenizer::CharTokenizer;
use haares_data::prepare::prepare_split;
use haares_data::prepared::PreparedShard;
use haares_data::{Split, dataset, embedded_corpus_dir};
use model::{ForeignDecoder, ForeignDecoderConfig};

/// What both methods train on, and how long.
struct Setup {
    vocab_size: usize,
    train: PreparedShard,
    held_out: Batch,
    steps: usize,
    batch_size: usize,
    seq: usize,
}

fn main() -> Result<(), Box<dyn Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let on_wgpu = args.first().is_some_and(|arg| arg == "--wgpu");
    if on_wgpu {
        args.remove(0);
    }
    let numbers: Vec<usize> = args
        .iter()
        .map(|arg| arg.parse())
        .collect::<Result<_, _>>()
        .map_err(|_| "usage: foreign_decoder [--wgpu] [steps] [batch] [seq], positive integers")?;
    let arg = |i: usize, default: usize| numbers.get(i).copied().unwrap_or(default).max(1);
    let (steps, batch_size, seq) = (arg(0, 40), arg(1, 8), arg(2, 64));

    let spec = dataset("sotu")?;
    let root = embedded_corpus_dir();
    let tokenizer = CharTokenizer::train_on(&spec, &root, 256)?;
    let cache = std::env::temp_dir().join("haares-foreign-decoder");
    let (train, _) = prepare_split(&spec, &root, Split::Train, &tokenizer, &cache, false)?;
    let (validation, _) =
        prepare_split(&spec, &root, Split::Validation, &tokenizer, &cache, false)?;
    // A batch row holds a chunk's tokens but its last as inputs (the paper's 512).
    let positions = train.chunk_len() - 1;
    if seq > positions {
        return Err(
            format!("seq must be at most the corpus's {positions} positions per row").into(),
        );
    }
    let held_out = validation_batches(&validation, batch_size)
        .next()
        .ok_or("the validation split is empty")?;

    let setup = Setup {
        vocab_size: tokenizer.vocab_size(),
        train,
        held_out,
        steps,
        batch_size,
        seq,
    };
    println!(
        "decoder of Burn's MultiHeadAttention, a GELU MLP and a token shift: d = 64, 3 layers x 3 \
         sublayers = 9 events in N = 3 blocks of m = 3; batch {batch_size} x {seq}, {steps} AdamW steps"
    );
    if on_wgpu {
        #[cfg(feature = "wgpu")]
        return compare::<Autodiff<Wgpu>>(&WgpuDevice::default(), &setup);
        #[cfg(not(feature = "wgpu"))]
        return Err("--wgpu needs haares-core's `wgpu` feature (`--features wgpu`)".into());
    }
    compare::<Autodiff<Flex>>(&Default::default(), &setup)
}

/// Trains HAARES and Block AttnRes from the same initial sublayer weights on `B` and prints a
/// row of the table for each.
fn compare<B: TrainingBackend>(device: &B::Device, setup: &Setup) -> Result<(), Box<dyn Error>> {
    let (steps, seq) = (setup.steps, setup.seq);
    println!(
        "| method | step 1 loss | step {steps} loss | validation loss | p_D (mean over sites with a detail slot) |"
    );
    println!("|---|---|---|---|---|");
    for method in [ResidualMethod::haares(), ResidualMethod::BlockAttnRes] {
        // The same seed for both methods: the sublayers start from the same weights.
        B::seed(device, 7);
        let config = ForeignDecoderConfig::new(setup.vocab_size).with_method(method);
        let mut decoder: ForeignDecoder<B> = config.init(device)?;
        let mut optimizer = AdamWConfig::new().with_weight_decay(0.0).init();
        let mut batches = BatchIterator::new(&setup.train, setup.batch_size, 0)?;
        let mut losses = Vec::with_capacity(steps);
        for _ in 0..steps {
            let loss = loss(&decoder, &batches.next_batch(), seq, None)?;
            losses.push(loss.clone().into_scalar().elem::<f32>());
            let grads = GradientsParams::from_grads(loss.backward(), &decoder);
            decoder = optimizer.step(3e-3, decoder, grads);
        }
        let mut trace = RoutingTrace::default();
        let valid: f32 = loss(&decoder.valid(), &setup.held_out, seq, Some(&mut trace))?
            .into_scalar()
            .elem();
        // p_D over the sites that see a detail slot (HAARES past each block's first read).
        let shares: Vec<f32> = trace
            .sites
            .iter()
            .filter(|site| site.kinds().contains(&SlotKind::Detail))
            .map(|site| site.detail_share().mean().into_scalar().elem())
            .collect();
        let p_detail = match shares.len() {
            0 => "– (no detail slot)".to_string(),
            n => format!("{:.4}", shares.iter().sum::<f32>() / n as f32),
        };
        println!(
            "| {} | {:.3} | {:.3} | {valid:.3} | {p_detail} |",
            method.label(),
            losses[0],
            losses[steps - 1],
        );
        if !losses.iter().all(|loss| loss.is_finite()) || !valid.is_finite() {
            return Err(format!("{}: a loss is not finite: {losses:?}", method.label()).into());
        }
    }
    Ok(())
}

/// The mean next-token cross-entropy over the real targets of the batch's first `seq` positions.
fn loss<B: haares_core::HaaresBackend>(
    decoder: &ForeignDecoder<B>,
    batch: &Batch,
    seq: usize,
    trace: Option<&mut RoutingTrace<B>>,
) -> haares_core::Result<Tensor<B, 1>> {
    let device = decoder.head.weight.device();
    let batch = batch.cropped(seq);
    let tokens = batch.batch_size * batch.seq_len;
    let ids = |values: &[u32]| -> Vec<i64> { values.iter().map(|&id| id as i64).collect() };
    let inputs = Tensor::<B, 2, Int>::from_data(
        TensorData::new(ids(&batch.inputs), [batch.batch_size, batch.seq_len]),
        &device,
    );
    let targets =
        Tensor::<B, 2, Int>::from_data(TensorData::new(ids(&batch.targets), [tokens, 1]), &device);
    let mask = Tensor::<B, 1>::from_data(TensorData::new(batch.mask, [tokens]), &device);
    let logits = decoder.forward(inputs, trace)?;
    let vocab = logits.dims()[2];
    let log_probs = log_softmax(logits.reshape([tokens, vocab]), 1);
    let picked = log_probs.gather(1, targets).reshape([tokens]);
    Ok(-(picked * mask.clone()).sum() / mask.sum().clamp_min(1.0))
}
