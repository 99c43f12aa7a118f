//! haares-data's test suite, one binary. Fixture shards are written in the tests with the
//! `parquet` crate.

mod downloads;
mod fixtures;
mod loader;
mod preparation;
mod sources;
mod tokenizers;
