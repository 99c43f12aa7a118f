//! Comparisons, each with a distribution-free interval and a verdict against a target the user
//! sets: between two methods ([`paired`]), against PyTorch's training step ([`versus`], reported
//! by [`versus_report`]), and every matrix product of a step by provider against `torch.matmul`
//! ([`products`]).

pub mod paired;
pub mod products;
pub mod versus;
pub mod versus_report;
