//! Row-by-row chunking (sec:methodology, docs/decisions.md, decision 8): each row's tokens are cut
//! into pieces of `CHUNK_LEN = 513` (512 inputs + the shifted target); rows are never concatenated,
//! no end-of-sequence token is inserted, a short tail is padded with `<pad>`, and pieces with fewer
//! than 2 real tokens (nothing to predict) are dropped.

/// Tokens per chunk: a context of 512 predictions needs 513 tokens.
pub const CHUNK_LEN: usize = 513;

/// One chunk: `CHUNK_LEN` ids, the first `len` of them real, the rest `<pad>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// The ids, padded to the chunk length.
    pub tokens: Vec<u32>,
    /// How many leading ids are real.
    pub len: usize,
}

/// Cuts one row's ids into chunks of `chunk_len`, padding the tail with `pad` and dropping pieces
/// with fewer than 2 real tokens.
pub fn chunk_row(ids: &[u32], chunk_len: usize, pad: u32) -> Vec<Chunk> {
    ids.chunks(chunk_len)
        .filter(|piece| piece.len() >= 2)
        .map(|piece| {
            let mut tokens = piece.to_vec();
            tokens.resize(chunk_len, pad);
            Chunk {
                tokens,
                len: piece.len(),
            }
        })
        .collect()
}
