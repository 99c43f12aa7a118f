//! The counting allocator behind the cost protocol's CPU memory, and what it shows about the
//! routing operator on NdArray: a read keeps no copy of its sources.

use burn::backend::{Autodiff, NdArray};
use burn::tensor::{Tensor, TensorData};
use haares_bench::measure::heap::{allocated_bytes, peak_allocated_bytes};
use haares_core::router::DepthRouterConfig;
use haares_core::{SlotKind, Source, SourceBank};

type Ad = Autodiff<NdArray>;

const MIB: u64 = 1 << 20;

/// One test, because the counters are process-wide and parallel tests would disturb them.
#[test]
fn allocations_are_counted_and_a_fused_read_keeps_no_copy_of_its_sources() {
    let before = allocated_bytes().expect("the counting allocator is installed");
    let block = vec![1u8; (8 * MIB) as usize];
    let during = allocated_bytes().unwrap();
    assert!(during >= before + 8 * MIB, "{before} → {during} bytes");
    assert!(peak_allocated_bytes().unwrap() >= during);
    drop(block);
    let after = allocated_bytes().unwrap();
    assert!(
        after < before + MIB,
        "a freed block still counted: {before} → {after}"
    );

    // Nine sources, as a HAARES read in the last block of a four-block model sees them.
    let (batch, seq, d, slots) = (4, 64, 96, 9);
    let slot_bytes = (batch * seq * d * 4) as u64;
    let device = Default::default();
    let values: Vec<Tensor<Ad, 3>> = (0..slots)
        .map(|slot| {
            let values: Vec<f32> = (0..batch * seq * d)
                .map(|i| ((i * 31 + slot * 17) % 23) as f32 / 11.0 - 1.0)
                .collect();
            Tensor::<Ad, 3>::from_data(TensorData::new(values, [batch, seq, d]), &device)
                .require_grad()
        })
        .collect();
    let mut bank = SourceBank::from_embedding(Source::with_mean_square(values[0].clone()));
    for (slot, value) in values.iter().enumerate().skip(1) {
        let kind = [SlotKind::Cumulative, SlotKind::Detail][slot % 2];
        bank.push_source(kind, Source::with_mean_square(value.clone()));
    }
    let router = DepthRouterConfig::new(d).init::<Ad>(&device);
    let before_read = allocated_bytes().unwrap();
    let read = router.forward_fused(&bank);
    let kept = allocated_bytes().unwrap() - before_read;
    // The mixture itself, the weights and per-token scalars: about one slot's worth. A copy of
    // every source (what a shared tensor's reshape costs on NdArray) would be nine more.
    assert!(
        kept < 3 * slot_bytes,
        "a {slots}-slot read keeps {:.2} slot sizes of new memory ({kept} bytes)",
        kept as f64 / slot_bytes as f64
    );
    drop(read);
}
