//! # haares-data
//!
//! Skeleton. The data pipelines of the paper (sec:methodology, app:data) — Parquet shards in the
//! hub layout, character and BPE tokenisers, prepared token shards, deterministic resumable
//! batching and the embedded State of the Union corpus — arrive with the data issue.
