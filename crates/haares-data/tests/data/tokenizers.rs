//! The character vocabulary (specials, ranking, ties, newlines, `<unk>`, save/load) and the BPE
//! tokenizer trained offline on the embedded corpus.

use haares_data::bpe::{BPE_SPECIALS, BpeTokenizer};
use haares_data::char_tokenizer::{
    CHAR_SPECIALS, CharCounter, CharTokenizer, UNK, normalize_newlines,
};
use haares_data::prepare::TextTokenizer;
use haares_data::registry::Split;
use haares_data::{dataset, embedded_corpus_dir};

#[test]
fn specials_come_first_then_characters_by_frequency_with_ties_by_code_point() {
    let mut counter = CharCounter::default();
    counter.add("bbb a c ddd\r\n");
    counter.add("b\rzy");
    // Counts: b 4, ' ' 3, d 3, '\n' 2, a 1, c 1, y 1, z 1.
    let tokenizer = counter.build(256).unwrap();
    assert_eq!(tokenizer.chars(), ['b', ' ', 'd', '\n', 'a', 'c', 'y', 'z']);
    assert_eq!(tokenizer.vocab_size(), CHAR_SPECIALS.len() + 8);
    assert_eq!(tokenizer.encode("b"), [4]);
    let truncated = counter.build(4 + 3).unwrap();
    assert_eq!(
        truncated.chars(),
        ['b', ' ', 'd'],
        "ties at the cut are decided by code point"
    );
    assert_eq!(truncated.encode("bq\n"), [4, UNK, UNK]);
}

#[test]
fn newlines_are_normalised() {
    assert_eq!(normalize_newlines("a\r\nb\rc\n"), "a\nb\nc\n");
    let mut counter = CharCounter::default();
    counter.add("x\r\ny");
    let tokenizer = counter.build(256).unwrap();
    assert!(!tokenizer.chars().contains(&'\r'));
    assert_eq!(tokenizer.encode("x\r\ny"), tokenizer.encode("x\ny"));
    assert_eq!(tokenizer.decode(&tokenizer.encode("x\r\ny")), "x\ny");
}

#[test]
fn the_vocabulary_is_saved_and_reloaded() {
    let mut counter = CharCounter::default();
    counter.add("héllo wörld 🙂");
    let tokenizer = counter.build(256).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vocab.json");
    tokenizer.save(&path).unwrap();
    assert_eq!(CharTokenizer::load(&path).unwrap(), tokenizer);
    std::fs::write(&path, r#"{"specials": ["<pad>"], "chars": []}"#).unwrap();
    assert!(
        CharTokenizer::load(&path)
            .unwrap_err()
            .to_string()
            .contains("specials")
    );
    assert!(
        counter.build(4).is_err(),
        "a vocabulary of specials only is refused"
    );
}

#[test]
fn bpe_trains_offline_on_the_embedded_corpus() {
    let spec = dataset("sotu").unwrap();
    // A 2 MB budget keeps the test quick; the paper's budget is 100M bytes (all of this corpus).
    let tokenizer =
        BpeTokenizer::train_on(&spec, &embedded_corpus_dir(), 4096, 2_000_000, false).unwrap();
    assert_eq!(TextTokenizer::vocab_size(&tokenizer), 4096);
    for (id, special) in BPE_SPECIALS.iter().enumerate() {
        assert_eq!(tokenizer.inner().token_to_id(special), Some(id as u32));
    }
    let text = "The State of the Union is strong.\nWe, the People — café ünïcode 🙂";
    let english =
        "The State of the Union is strong, and the people of the United States have made it so.";
    let english_ids = tokenizer.encode(english).unwrap();
    assert!(
        english_ids.len() < english.len() / 2,
        "BPE compresses ordinary English: {} ids for {} bytes",
        english_ids.len(),
        english.len()
    );
    let ids = tokenizer.encode(text).unwrap();
    assert!(
        ids.iter()
            .all(|&id| id < 4096 && id as usize <= u16::MAX as usize)
    );
    assert_eq!(
        tokenizer.decode(&ids).unwrap(),
        text,
        "byte-level BPE round-trips any text"
    );

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    tokenizer.save(&path).unwrap();
    let reloaded = BpeTokenizer::load(&path).unwrap();
    assert_eq!(reloaded.encode(text).unwrap(), ids);
    assert_eq!(reloaded.fingerprint(), tokenizer.fingerprint());
    // Prepared BPE data is stored as u16.
    let cache = tempfile::tempdir().unwrap();
    let (shard, _) = haares_data::prepare::prepare_split(
        &spec,
        &embedded_corpus_dir(),
        Split::Validation,
        &tokenizer,
        cache.path(),
        false,
    )
    .unwrap();
    assert_eq!(shard.width(), haares_data::prepared::TokenWidth::U16);
    assert_eq!(shard.vocab_size(), 4096);
}

#[test]
fn vocabularies_too_large_for_the_id_type_are_refused() {
    let error = BpeTokenizer::train(["abc"], 70_000, 10, false).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("does not fit the u16 token storage")
    );
    assert!(haares_data::prepared::TokenWidth::for_vocab(65_537).is_err());
}
