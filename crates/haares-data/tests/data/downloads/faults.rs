//! The download path end to end: the pinned revision and nothing else, only the files the split
//! rule reads, nothing fetched twice, and each fault a download meets, with its message and a
//! rerun that completes once the fault is gone. A process killed mid-download and a disk that
//! fills are in haares-train's tests, which run the binary.

use haares_data::RowSource;
use haares_data::Split;
use haares_data::hub::{download, is_downloaded, snapshot_dir};
use haares_data::local_hub::Fault;

use super::world::*;

#[test]
fn the_pinned_revision_and_the_shards_its_rule_reads_are_fetched_once() {
    // Five training shards in two folders: the rule takes the first three by file name, so
    // `b/train-00001` comes before `a/train-00003`.
    let pinned: Vec<(&str, Vec<u8>)> = vec![
        ("a/train-00003.parquet", shard(3, 8)),
        ("a/train-00000.parquet", shard(0, 8)),
        ("b/train-00001.parquet", shard(1, 8)),
        ("b/train-00004.parquet", shard(4, 8)),
        ("b/train-00002.parquet", shard(2, 8)),
        ("README.md", b"# corpus\n".to_vec()),
        ("b/validation-00000.parquet", shard(9, 8)),
    ];
    let world = World::with(&pinned);
    // A newer revision with other bytes under the same names, which `main` points at.
    world.hub.publish(
        REPO,
        NEWER,
        pinned
            .iter()
            .map(|(p, _)| (p.to_string(), shard(99, 8)))
            .collect(),
    );
    world.hub.alias(REPO, "main", NEWER);
    let spec = spec(PINNED, first(3));
    let root = world.download(&spec).unwrap();
    assert_eq!(root, self::root(&world, &spec));
    let wanted = [
        "a/train-00000.parquet",
        "b/train-00001.parquet",
        "b/train-00002.parquet",
    ];
    let mut fetched = world.fetched();
    fetched.sort();
    assert_eq!(fetched, wanted);
    for (path, bytes) in pinned.iter().filter(|(p, _)| wanted.contains(p)) {
        assert_eq!(&std::fs::read(root.join(path)).unwrap(), bytes, "{path}");
    }
    for request in world.hub.requests() {
        assert!(
            request.url.contains(PINNED) && !request.url.contains(NEWER),
            "{request:?}"
        );
    }
    assert!(!root.join("a/train-00003.parquet").exists());
    assert!(!root.join("README.md").exists());
    assert!(is_downloaded(&spec, world.cache.path()));
    let mut rows = 0;
    let reader = spec.split_reader(&root, Split::Train).unwrap();
    reader.for_each_row(|_| Ok(rows += 1)).unwrap();
    assert!(rows > 0);

    // A second run asks the hub nothing, not even the listing.
    world.hub.clear_requests();
    assert_eq!(world.download(&spec).unwrap(), root);
    assert_eq!(world.hub.requests(), vec![]);
    // A rule that reads one shard more fetches that one only.
    let four = self::spec(PINNED, first(4));
    assert!(!is_downloaded(&four, world.cache.path()));
    assert_eq!(world.download(&four).unwrap(), root);
    assert_eq!(world.fetched(), ["a/train-00003.parquet"]);
}

#[test]
fn a_revision_the_hub_does_not_hold_or_resolves_elsewhere_is_refused() {
    let world = World::with(&[("data/train-0.parquet", shard(0, 4))]);
    world.hub.publish(
        REPO,
        NEWER,
        vec![("data/train-0.parquet".into(), shard(1, 4))],
    );
    world.hub.alias(REPO, "main", NEWER);
    let missing = spec("3333333333333333333333333333333333333333", first(1));
    let message = world.download(&missing).unwrap_err();
    assert!(
        message.contains("3333333333333333333333333333333333333333")
            && message.contains(REPO)
            && message.contains("404"),
        "{message}"
    );
    // A branch name is not a pinned commit: the hub resolves it to NEWER, and that is refused.
    let branch = spec("main", first(1));
    let message = world.download(&branch).unwrap_err();
    assert!(
        message.contains("to commit") && message.contains(NEWER),
        "{message}"
    );
    assert_eq!(world.fetched(), Vec::<String>::new());
    assert_eq!(world.cached(), Vec::<String>::new());
}

#[test]
fn a_server_error_or_a_missing_file_names_the_file_and_a_rerun_completes() {
    let bytes = shard(0, 16);
    let world = World::with(&[
        ("data/train-0.parquet", shard(1, 4)),
        ("data/train-1.parquet", bytes.clone()),
    ]);
    let spec = spec(PINNED, first(2));
    for (code, says) in [(404, "not in"), (500, "a server error")] {
        world.hub.fail("data/train-1.parquet", Fault::Status(code));
        let message = world.download(&spec).unwrap_err();
        assert!(
            message.contains("data/train-1.parquet")
                && message.contains(&code.to_string())
                && message.contains(says),
            "{message}"
        );
        assert!(!root(&world, &spec).join("data/train-1.parquet").exists());
        assert!(!is_downloaded(&spec, world.cache.path()));
    }
    world.hub.heal();
    world.hub.clear_requests();
    let root = world.download(&spec).unwrap();
    assert_eq!(
        std::fs::read(root.join("data/train-1.parquet")).unwrap(),
        bytes
    );
    // The first shard, checked before the fault, is not fetched again.
    assert_eq!(world.fetched(), ["data/train-1.parquet"]);
}

#[test]
fn a_dropped_connection_resumes_within_the_run_and_in_the_next_one() {
    let bytes = shard(0, 600);
    let path = "data/train-0.parquet";
    let world = World::with(&[(path, bytes.clone())]);
    let spec = spec(PINNED, first(1));
    let cut = 100 * 1024;
    assert!(bytes.len() > 5 * cut, "{}", bytes.len());
    world.hub.fail(path, Fault::Cut(cut));
    let message = world.download(&spec).unwrap_err();
    assert!(
        message.contains(path) && message.contains("resumes"),
        "{message}"
    );
    assert!(!root(&world, &spec).join(path).exists());
    // Each attempt resumed where the last one was cut: the retries asked for the later bytes.
    assert_eq!(
        world.range_starts(path),
        (0..5).map(|i| i * cut as u64).collect::<Vec<_>>()
    );
    let kept = 5 * cut;
    assert!(
        message.contains(&format!("{kept} of {} bytes", bytes.len())),
        "{message}"
    );

    world.hub.heal();
    world.hub.clear_requests();
    let root = world.download(&spec).unwrap();
    assert_eq!(std::fs::read(root.join(path)).unwrap(), bytes);
    assert_eq!(world.range_starts(path), [kept as u64]);
    assert!(
        !world.cached().iter().any(|f| f.ends_with(".part")),
        "{:?}",
        world.cached()
    );
}

#[test]
fn a_file_served_at_the_wrong_size_is_deleted_never_used() {
    let bytes = shard(0, 32);
    let path = "data/train-0.parquet";
    let world = World::with(&[(path, bytes.clone())]);
    let spec = spec(PINNED, first(1));
    for size in [bytes.len() - 1000, bytes.len() + 1000] {
        world.hub.fail(path, Fault::Size(size));
        let message = world.download(&spec).unwrap_err();
        assert!(
            message.contains(path)
                && message.contains(&format!("{size} bytes, the listing says {}", bytes.len()))
                && message.contains("deleted"),
            "{message}"
        );
        assert!(!root(&world, &spec).join(path).is_symlink());
        // Only `hf-hub`'s lock file is left of it.
        let blobs = world.cached();
        assert!(
            !blobs
                .iter()
                .any(|f| f.contains("/blobs/") && !f.ends_with(".lock")),
            "{blobs:?}"
        );
    }
    world.hub.heal();
    let root = world.download(&spec).unwrap();
    assert_eq!(std::fs::read(root.join(path)).unwrap(), bytes);
}

#[test]
fn a_file_that_changed_under_its_revision_mid_download_is_caught_by_its_hash() {
    // The hub changes the file and keeps its ETag: the resumed download appends the new bytes to
    // the old ones, a file of the right size that is neither.
    let (old, new) = (shard(0, 400), shard(1, 400));
    let path = "data/train-0.parquet";
    let world = World::with(&[(path, old)]);
    let spec = spec(PINNED, first(1));
    world.hub.fail(path, Fault::Cut(50 * 1024));
    world.download(&spec).unwrap_err();
    world.hub.replace(REPO, PINNED, path, new.clone());
    world.hub.heal();
    let message = world.download(&spec).unwrap_err();
    assert!(
        message.contains(path) && message.contains("SHA-256") && message.contains("rerun"),
        "{message}"
    );
    assert!(!root(&world, &spec).join(path).is_symlink());
    let root = world.download(&spec).unwrap();
    assert_eq!(std::fs::read(root.join(path)).unwrap(), new);
    // Changed again after a complete, checked download: the next run asks nothing and keeps the
    // checked copy (a pinned commit's files do not change; its prepared tokens stay valid).
    world.hub.replace(REPO, PINNED, path, shard(2, 400));
    world.hub.clear_requests();
    assert_eq!(world.download(&spec).unwrap(), root);
    assert_eq!(world.hub.requests(), vec![]);
    assert_eq!(std::fs::read(root.join(path)).unwrap(), new);
}

#[test]
fn files_placed_by_hand_are_checked_and_used_offline_unless_a_download_began() {
    let bytes = shard(0, 8);
    let path = "data/train-0.parquet";
    let world = World::with(&[(path, bytes.clone())]);
    let spec = spec(PINNED, first(1));
    let root = root(&world, &spec);
    std::fs::create_dir_all(root.join("data")).unwrap();
    // Different bytes placed by hand: refused, and left where the user put them.
    std::fs::write(root.join(path), b"not the hub's file").unwrap();
    let message = world.download(&spec).unwrap_err();
    assert!(
        message.contains("placed by hand") && message.contains(path),
        "{message}"
    );
    assert!(root.join(path).exists());
    // The hub's bytes placed by hand: checked and used, nothing fetched.
    std::fs::write(root.join(path), &bytes).unwrap();
    world.hub.clear_requests();
    assert_eq!(world.download(&spec).unwrap(), root);
    assert_eq!(world.fetched(), Vec::<String>::new());

    // Without a hub, files placed by hand where nothing was downloaded are used as they are.
    let offline = tempfile::tempdir().unwrap();
    let hand = snapshot_dir(&spec, offline.path()).unwrap();
    std::fs::create_dir_all(hand.join("data")).unwrap();
    std::fs::write(hand.join(path), &bytes).unwrap();
    assert_eq!(download(&spec, &unreachable(offline.path())).unwrap(), hand);

    // A download that began (one of two shards checked) is never taken for a complete one.
    let two = World::with(&[(path, bytes.clone()), ("data/train-1.parquet", shard(1, 8))]);
    let spec = self::spec(PINNED, first(2));
    two.hub.fail("data/train-1.parquet", Fault::Status(500));
    two.download(&spec).unwrap_err();
    let message = download(&spec, &unreachable(two.cache.path()))
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("the hub could not be reached"),
        "{message}"
    );
}
