//! Prepared token shards: a split tokenised once into a binary file that training memory-maps.
//!
//! Layout (little-endian):
//! - header, 64 bytes: magic `HAARESTK`, format version `u32` (2), token width in bytes `u32`
//!   (1 for `u8`, 2 for `u16`), vocabulary size `u32`, chunk length `u32`, chunk count `u64`,
//!   the fingerprint of the source files it was prepared from `u64` ([`crate::sources`]; 0 when
//!   none was given), zero padding;
//! - index: one `u16` per chunk, its number of real tokens (the rest is `<pad>`); zero padding to
//!   a multiple of 8 bytes;
//! - tokens: chunk after chunk, `chunk length` ids each.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::chunking::Chunk;
use crate::error::{DataError, Result};

const MAGIC: &[u8; 8] = b"HAARESTK";
const VERSION: u32 = 2;
const HEADER_LEN: usize = 64;

/// Storage width of token ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenWidth {
    /// One byte per id (character vocabularies of at most 256 entries).
    U8,
    /// Two bytes per id (BPE vocabularies of at most 65,536 entries).
    U16,
}

impl TokenWidth {
    /// The narrowest width holding every id of a `vocab_size`-entry vocabulary.
    pub fn for_vocab(vocab_size: usize) -> Result<Self> {
        match vocab_size {
            0..=256 => Ok(Self::U8),
            257..=65536 => Ok(Self::U16),
            _ => Err(DataError::Tokenizer(format!(
                "a vocabulary of {vocab_size} entries does not fit the u16 token storage (at most 65,536)"
            ))),
        }
    }
    fn bytes(self) -> usize {
        match self {
            Self::U8 => 1,
            Self::U16 => 2,
        }
    }
}

/// Writes a prepared shard chunk by chunk into a temporary file, renamed into place by
/// [`finish`](Self::finish): an interrupted preparation never leaves a file that looks complete,
/// and a failed or abandoned one (a full disk, an error of the tokenizer) removes its temporary
/// files when the writer is dropped.
pub struct PreparedWriter {
    path: PathBuf,
    temporary: PathBuf,
    width: TokenWidth,
    vocab_size: usize,
    chunk_len: usize,
    lengths: Vec<u16>,
    /// `None` once [`finish`](Self::finish) took it.
    tokens: Option<BufWriter<Output>>,
    tokens_path: PathBuf,
    sources: u64,
    space: Space,
}

/// The room the writer's files may take: the disk's (`None`), or, in tests, a budget of bytes
/// after which a write fails as on a full disk.
type Space = Option<std::sync::Arc<std::sync::atomic::AtomicU64>>;

/// A file written within [`Space`].
struct Output {
    file: std::fs::File,
    space: Space,
}

impl Output {
    fn create(path: &Path, space: &Space) -> Result<Self> {
        let file = std::fs::File::create(path).map_err(io(path))?;
        Ok(Self {
            file,
            space: space.clone(),
        })
    }
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Some(space) = &self.space {
            use std::sync::atomic::Ordering;
            let left = space.load(Ordering::Relaxed);
            if left < buf.len() as u64 {
                return Err(std::io::ErrorKind::StorageFull.into());
            }
            space.fetch_sub(buf.len() as u64, Ordering::Relaxed);
        }
        self.file.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

impl PreparedWriter {
    /// Starts a shard for `path`.
    pub fn create(path: &Path, vocab_size: usize, chunk_len: usize) -> Result<Self> {
        Self::create_within(path, vocab_size, chunk_len, None)
    }

    fn create_within(
        path: &Path,
        vocab_size: usize,
        chunk_len: usize,
        space: Space,
    ) -> Result<Self> {
        let width = TokenWidth::for_vocab(vocab_size)?;
        if !(2..=u16::MAX as usize).contains(&chunk_len) {
            return Err(DataError::format(
                path,
                format!("chunk length {chunk_len} must be between 2 and 65,535"),
            ));
        }
        let temporary = crate::temporary_beside(path);
        let tokens_path = crate::temporary_beside(&path.with_extension("tokens-data"));
        let tokens = Output::create(&tokens_path, &space)?;
        Ok(Self {
            path: path.to_path_buf(),
            temporary,
            width,
            vocab_size,
            chunk_len,
            lengths: Vec::new(),
            tokens: Some(BufWriter::new(tokens)),
            tokens_path,
            sources: 0,
            space,
        })
    }

    /// Records the fingerprint of the source files ([`crate::sources`]) in the header.
    pub fn with_sources(mut self, fingerprint: u64) -> Self {
        self.sources = fingerprint;
        self
    }

    /// Appends one chunk.
    pub fn push(&mut self, chunk: &Chunk) -> Result<()> {
        if chunk.tokens.len() != self.chunk_len || chunk.len > self.chunk_len {
            return Err(DataError::format(
                &self.path,
                format!(
                    "a chunk of {} ids ({} real) does not fit chunks of {}",
                    chunk.tokens.len(),
                    chunk.len,
                    self.chunk_len
                ),
            ));
        }
        let io = |e| DataError::io(&self.tokens_path, e);
        let tokens = self
            .tokens
            .as_mut()
            .expect("a writer is not used after finish");
        for &id in &chunk.tokens {
            if id as usize >= self.vocab_size {
                return Err(DataError::Tokenizer(format!(
                    "id {id} is outside the vocabulary of {} entries",
                    self.vocab_size
                )));
            }
            match self.width {
                TokenWidth::U8 => tokens.write_all(&[id as u8]).map_err(io)?,
                TokenWidth::U16 => tokens.write_all(&(id as u16).to_le_bytes()).map_err(io)?,
            }
        }
        self.lengths.push(chunk.len as u16);
        Ok(())
    }

    /// Chunks written so far.
    pub fn chunks(&self) -> usize {
        self.lengths.len()
    }

    /// Writes header and index, appends the tokens, syncs and renames into place.
    pub fn finish(mut self) -> Result<PreparedShard> {
        let (path, temporary, tokens_path) = (&self.path, &self.temporary, &self.tokens_path);
        let tokens = self.tokens.take().expect("finish is called once");
        tokens
            .into_inner()
            .map_err(|e| DataError::io(tokens_path, e.into_error()))?
            .file
            .sync_all()
            .map_err(io(tokens_path))?;
        let mut out = BufWriter::new(Output::create(temporary, &self.space)?);
        let mut header = Vec::with_capacity(HEADER_LEN);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&VERSION.to_le_bytes());
        header.extend_from_slice(&(self.width.bytes() as u32).to_le_bytes());
        header.extend_from_slice(&(self.vocab_size as u32).to_le_bytes());
        header.extend_from_slice(&(self.chunk_len as u32).to_le_bytes());
        header.extend_from_slice(&(self.lengths.len() as u64).to_le_bytes());
        header.extend_from_slice(&self.sources.to_le_bytes());
        header.resize(HEADER_LEN, 0);
        out.write_all(&header).map_err(io(temporary))?;
        for len in &self.lengths {
            out.write_all(&len.to_le_bytes()).map_err(io(temporary))?;
        }
        out.write_all(&vec![0; index_padding(self.lengths.len())])
            .map_err(io(temporary))?;
        let mut token_file = std::fs::File::open(tokens_path).map_err(io(tokens_path))?;
        std::io::copy(&mut token_file, &mut out).map_err(io(temporary))?;
        out.into_inner()
            .map_err(|e| DataError::io(temporary, e.into_error()))?
            .file
            .sync_all()
            .map_err(io(temporary))?;
        std::fs::rename(temporary, path).map_err(io(path))?;
        PreparedShard::open(path)
    }
}

impl Drop for PreparedWriter {
    /// Removes the temporary files; after a successful [`finish`](Self::finish) only the token
    /// data's is left (the shard's own was renamed into place).
    fn drop(&mut self) {
        drop(self.tokens.take());
        let _ = std::fs::remove_file(&self.tokens_path);
        let _ = std::fs::remove_file(&self.temporary);
    }
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> DataError + '_ {
    move |e| DataError::io(path, e)
}

fn index_padding(chunks: usize) -> usize {
    (8 - (2 * chunks) % 8) % 8
}

/// A memory-mapped prepared shard.
#[derive(Debug)]
pub struct PreparedShard {
    path: PathBuf,
    map: Mmap,
    width: TokenWidth,
    vocab_size: usize,
    chunk_len: usize,
    chunks: usize,
    tokens_offset: usize,
    sources: u64,
}

impl PreparedShard {
    /// Maps and validates a shard written by [`PreparedWriter`].
    pub fn open(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| DataError::io(path, e))?;
        // Safety: the file is only ever written through a temporary file and a rename, so a mapped
        // shard is never modified in place.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| DataError::io(path, e))?;
        let bad = |message: String| {
            DataError::format(
                path,
                format!("{message}; delete the file to prepare it again"),
            )
        };
        if map.len() < HEADER_LEN || &map[..8] != MAGIC {
            return Err(bad("not a prepared token shard (bad magic)".into()));
        }
        let u32_at = |at: usize| u32::from_le_bytes(map[at..at + 4].try_into().expect("4 bytes"));
        let version = u32_at(8);
        if version != VERSION {
            return Err(bad(format!(
                "format version {version}, this build reads {VERSION}"
            )));
        }
        let width = match u32_at(12) {
            1 => TokenWidth::U8,
            2 => TokenWidth::U16,
            other => return Err(bad(format!("token width {other} bytes is not 1 or 2"))),
        };
        let (vocab_size, chunk_len) = (u32_at(16) as usize, u32_at(20) as usize);
        let u64_at = |at: usize| u64::from_le_bytes(map[at..at + 8].try_into().expect("8 bytes"));
        let (chunks, sources) = (u64_at(24) as usize, u64_at(32));
        let tokens_offset = HEADER_LEN + 2 * chunks + index_padding(chunks);
        let expected = tokens_offset + chunks * chunk_len * width.bytes();
        if map.len() != expected {
            return Err(bad(format!(
                "{} bytes, expected {expected} for {chunks} chunks of {chunk_len}",
                map.len()
            )));
        }
        Ok(Self {
            path: path.to_path_buf(),
            map,
            width,
            vocab_size,
            chunk_len,
            chunks,
            tokens_offset,
            sources,
        })
    }

    /// The fingerprint of the source files it was prepared from (0: not recorded).
    pub fn sources(&self) -> u64 {
        self.sources
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// Number of chunks.
    pub fn len(&self) -> usize {
        self.chunks
    }
    /// Whether the shard holds no chunk.
    pub fn is_empty(&self) -> bool {
        self.chunks == 0
    }
    /// Tokens per chunk.
    pub fn chunk_len(&self) -> usize {
        self.chunk_len
    }
    /// Vocabulary size recorded at preparation.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }
    /// Storage width of the ids.
    pub fn width(&self) -> TokenWidth {
        self.width
    }

    /// Real (non-pad) tokens of chunk `i`.
    pub fn real_len(&self, i: usize) -> usize {
        u16::from_le_bytes([
            self.map[HEADER_LEN + 2 * i],
            self.map[HEADER_LEN + 2 * i + 1],
        ]) as usize
    }

    /// Copies chunk `i`'s ids into `out` (cleared first).
    pub fn read_chunk(&self, i: usize, out: &mut Vec<u32>) {
        out.clear();
        let start = self.tokens_offset + i * self.chunk_len * self.width.bytes();
        match self.width {
            TokenWidth::U8 => out.extend(
                self.map[start..start + self.chunk_len]
                    .iter()
                    .map(|&b| b as u32),
            ),
            TokenWidth::U16 => out.extend(
                self.map[start..start + 2 * self.chunk_len]
                    .chunks_exact(2)
                    .map(|b| u16::from_le_bytes([b[0], b[1]]) as u32),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicU64;

    use super::*;

    fn chunk() -> Chunk {
        Chunk {
            tokens: vec![1; 16],
            len: 16,
        }
    }

    /// Fills a disk of `space` bytes with `chunks` chunks of 16 one-byte ids: the error, and what
    /// the folder holds after the writer is gone.
    fn fill(space: u64, chunks: usize) -> (String, Vec<String>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("corpus-train-char.tokens");
        let disk = Some(Arc::new(AtomicU64::new(space)));
        let mut writer = PreparedWriter::create_within(&path, 100, 16, disk).unwrap();
        let error = match (0..chunks).try_for_each(|_| writer.push(&chunk())) {
            Err(error) => {
                drop(writer);
                error
            }
            Ok(()) => writer.finish().unwrap_err(),
        };
        let left = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        (error.to_string(), left)
    }

    #[test]
    fn a_disk_that_fills_while_tokens_are_written_leaves_no_file_behind() {
        // 1,000 chunks are 16,000 bytes; the buffered writer's first 8 KiB do not fit.
        let (message, left) = fill(4_000, 1_000);
        assert!(message.contains("corpus-train-char.tokens"), "{message}");
        assert!(
            message.contains("disk is full") && message.contains("rerun"),
            "{message}"
        );
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_disk_that_fills_while_the_shard_is_assembled_leaves_no_file_behind() {
        // The tokens fit (1,600 bytes); their copy behind the header and index does not.
        let (message, left) = fill(2_500, 100);
        assert!(message.contains("corpus-train-char.tokens"), "{message}");
        assert!(message.contains("disk is full"), "{message}");
        assert!(left.is_empty(), "{left:?}");
    }
}
