//! haares-data's test suite, one binary. Fixture shards are written in the tests with the
//! `parquet` crate.

// The local hub is on in every workspace test build (the self dev-dependency); a test of the
// published crate alone has it with `--features local-hub`.
#[cfg(feature = "local-hub")]
mod downloads;
mod fixtures;
mod loader;
mod preparation;
mod sources;
mod tokenizers;
