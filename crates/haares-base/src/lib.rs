//! # haares-base
//!
//! What every haares crate shares, defined once: the [`SplitMix64`] generator and the atomic file
//! write ([`write_atomically`]). Nothing here knows about models or data.
#![warn(missing_docs)]

/// The crate README's example, compiled and run as a doctest so that it cannot drift.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

mod atomic;
mod splitmix;

pub use atomic::write_atomically;
pub use splitmix::SplitMix64;
