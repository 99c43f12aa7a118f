//! What the user placed is never deleted, and a complete download is never fetched again: a link
//! to a shared copy that fails the check, a whole folder linked in, a file the hub claims to
//! serve from another commit, and a complete partial file that `hf-hub` did not take.

use std::path::Path;

use haares_data::local_hub::Fault;

use super::world::*;

const TRAIN: &str = "data/train-0.parquet";

#[cfg(unix)]
fn link(target: &Path, at: &Path) {
    std::fs::create_dir_all(at.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(target, at).unwrap();
}

#[test]
#[cfg(unix)]
fn a_link_to_a_shared_file_that_fails_the_check_is_refused_and_neither_is_deleted() {
    let bytes = shard(0, 8);
    let world = World::with(&[(TRAIN, bytes.clone())]);
    let spec = spec(PINNED, first(1));
    let shared = tempfile::tempdir().unwrap();
    let theirs = shared.path().join("train-0.parquet");
    std::fs::write(&theirs, b"an older copy of the shard").unwrap();
    let placed = root(&world, &spec).join(TRAIN);
    link(&theirs, &placed);
    let before = snapshot_of(shared.path());

    let message = world.download(&spec).unwrap_err();
    assert!(
        message.contains("placed by hand") && message.contains(TRAIN),
        "{message}"
    );
    assert_eq!(snapshot_of(shared.path()), before);
    assert!(placed.is_symlink() && std::fs::read_link(&placed).unwrap() == theirs);
    assert_eq!(world.fetched(), Vec::<String>::new());

    // The same link to the hub's bytes is checked and used as it is.
    std::fs::write(&theirs, &bytes).unwrap();
    let root = world.download(&spec).unwrap();
    assert_eq!(std::fs::read(root.join(TRAIN)).unwrap(), bytes);
    assert!(placed.is_symlink());
    assert_eq!(world.fetched(), Vec::<String>::new());
}

#[test]
#[cfg(unix)]
fn a_folder_linked_to_a_shared_copy_is_never_written_to_nor_deleted_from() {
    let files = [
        ("data/train-0.parquet", shard(0, 8)),
        ("data/train-1.parquet", shard(1, 8)),
    ];
    let world = World::with(&files);
    let spec = spec(PINNED, first(2));
    let shared = tempfile::tempdir().unwrap();
    std::fs::write(shared.path().join("train-0.parquet"), &files[0].1).unwrap();
    std::fs::write(shared.path().join("train-1.parquet"), b"not the hub's").unwrap();
    link(shared.path(), &root(&world, &spec).join("data"));
    let before = snapshot_of(shared.path());

    let message = world.download(&spec).unwrap_err();
    assert!(
        message.contains("placed by hand") && message.contains("train-1.parquet"),
        "{message}"
    );
    assert_eq!(snapshot_of(shared.path()), before);

    // A file missing from the linked folder is not downloaded into it.
    std::fs::remove_file(shared.path().join("train-1.parquet")).unwrap();
    let before = snapshot_of(shared.path());
    let message = world.download(&spec).unwrap_err();
    assert!(
        message.contains("is missing") && message.contains("link placed by hand"),
        "{message}"
    );
    assert_eq!(snapshot_of(shared.path()), before);
    assert_eq!(world.fetched(), Vec::<String>::new());

    // The complete shared copy is checked and used.
    std::fs::write(shared.path().join("train-1.parquet"), &files[1].1).unwrap();
    let root = world.download(&spec).unwrap();
    assert_eq!(std::fs::read(root.join(files[1].0)).unwrap(), files[1].1);
    assert_eq!(world.fetched(), Vec::<String>::new());
}

#[test]
fn a_file_served_from_another_commit_leaves_what_is_there_alone() {
    let bytes = shard(0, 8);
    let world = World::with(&[(TRAIN, bytes.clone())]);
    let spec = spec(PINNED, first(1));
    world.hub.fail(TRAIN, Fault::ServedFrom(NEWER.into()));
    // Nothing under the other commit: what the client wrote there goes.
    let message = world.download(&spec).unwrap_err();
    assert!(message.contains(NEWER), "{message}");
    let other = root(&world, &spec)
        .parent()
        .unwrap()
        .join(NEWER)
        .join(TRAIN);
    assert!(!other.exists() && !other.is_symlink());

    // The user's own file there: `hf-hub` hands its path back untouched, and so does the run.
    std::fs::create_dir_all(other.parent().unwrap()).unwrap();
    std::fs::write(&other, b"the user's file").unwrap();
    let message = world.download(&spec).unwrap_err();
    assert!(
        message.contains(NEWER) && message.contains("left as it is"),
        "{message}"
    );
    assert_eq!(std::fs::read(&other).unwrap(), b"the user's file");
}

#[test]
fn a_complete_partial_file_is_checked_and_used_not_fetched_again() {
    // 4.5 cuts: the fifth attempt, the last `hf-hub` makes, completes the file, and `hf-hub`
    // still returns `TooManyRetries`.
    let cut = 64 * 1024;
    // The hub and the check do not read the content: any bytes do.
    let bytes: Vec<u8> = (0..4 * cut + cut / 2)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    let world = World::with(&[(TRAIN, bytes.clone())]);
    let spec = spec(PINNED, first(1));
    world.hub.fail(TRAIN, Fault::Cut(cut));
    let root = world.download(&spec).unwrap();
    assert_eq!(std::fs::read(root.join(TRAIN)).unwrap(), bytes);
    // Every byte once, and the one-byte probe of the file's size.
    assert_eq!(world.hub.bytes_served(), bytes.len() as u64 + 1);
    assert!(!world.cached().iter().any(|f| f.ends_with(".part")));

    // A complete partial file left by an earlier run (killed between its last byte and the
    // rename) is taken without a byte fetched.
    let other = World::with(&[(TRAIN, bytes.clone())]);
    let digest = sha256_hex(&bytes);
    let blobs = other
        .cache
        .path()
        .join("datasets--test-owner--corpus/blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::write(blobs.join(format!("{digest}.part")), &bytes).unwrap();
    let root = other.download(&spec).unwrap();
    assert_eq!(std::fs::read(root.join(TRAIN)).unwrap(), bytes);
    assert_eq!(other.hub.bytes_served(), 0);
    assert!(root.join(TRAIN).is_symlink() || cfg!(not(unix)));

    // One of the right length and other bytes is deleted and the file fetched whole.
    let third = World::with(&[(TRAIN, bytes.clone())]);
    let blobs = third
        .cache
        .path()
        .join("datasets--test-owner--corpus/blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::write(blobs.join(format!("{digest}.part")), vec![7u8; bytes.len()]).unwrap();
    let root = third.download(&spec).unwrap();
    assert_eq!(std::fs::read(root.join(TRAIN)).unwrap(), bytes);
    assert_eq!(third.hub.bytes_served(), bytes.len() as u64 + 1);
}
