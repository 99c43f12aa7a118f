//! Only a hub that cannot be reached lets files placed by hand be used unchecked: every answer of
//! a hub that can be reached (a status, a listing for another commit, no file for the split rule,
//! fewer files than it reads) is an error naming what the hub said. And the local hub answers as
//! the hub does where the client depends on it.

use haares_data::hub::download;
use haares_data::local_hub::{Fault, LocalHub};

use super::world::*;

const TRAIN: &str = "data/train-0.parquet";

/// A world whose snapshot holds the hub's own file placed by hand.
fn placed_by_hand(bytes: &[u8]) -> (World, haares_data::DatasetSpec) {
    let world = World::with(&[(TRAIN, bytes.to_vec())]);
    let spec = spec(PINNED, first(1));
    let placed = root(&world, &spec).join(TRAIN);
    std::fs::create_dir_all(placed.parent().unwrap()).unwrap();
    std::fs::write(placed, bytes).unwrap();
    (world, spec)
}

fn listings(world: &World) -> usize {
    world
        .hub
        .requests()
        .iter()
        .filter(|r| r.url.starts_with("/api/"))
        .count()
}

#[test]
fn every_status_of_the_listing_is_an_error_even_with_files_placed_by_hand() {
    let bytes = shard(0, 4);
    for (status, says) in [
        (404, "404"),
        (401, "HF_TOKEN"),
        (403, "HF_TOKEN"),
        (500, "a server error"),
        (503, "a server error"),
    ] {
        let (world, spec) = placed_by_hand(&bytes);
        world.hub.fail_listing(status, usize::MAX);
        let message = world.download(&spec).unwrap_err();
        assert!(
            message.contains(&status.to_string())
                && message.contains(says)
                && message.contains("not used while the hub answers so"),
            "{status}: {message}"
        );
        // A server error is asked again, with a backoff, before it is the answer.
        let expected = if status >= 500 { 4 } else { 1 };
        assert_eq!(listings(&world), expected, "{status}");
    }
}

#[test]
fn a_server_error_that_passes_is_retried_and_the_download_completes() {
    let bytes = shard(0, 4);
    let world = World::with(&[(TRAIN, bytes.clone())]);
    let spec = spec(PINNED, first(1));
    world.hub.fail_listing(503, 2);
    let root = world.download(&spec).unwrap();
    assert_eq!(std::fs::read(root.join(TRAIN)).unwrap(), bytes);
    assert_eq!(listings(&world), 3);
}

#[test]
fn a_listing_for_another_commit_or_without_the_rules_files_is_an_error_with_files_placed_by_hand() {
    let bytes = shard(0, 4);
    // Another commit: the pinned revision asked for, a hub that resolves it elsewhere.
    let (world, _) = placed_by_hand(&bytes);
    world
        .hub
        .publish(REPO, NEWER, vec![(TRAIN.into(), shard(1, 4))]);
    world.hub.alias(REPO, "main", NEWER);
    let branch = spec("main", first(1));
    let placed = root(&world, &branch).join(TRAIN);
    std::fs::create_dir_all(placed.parent().unwrap()).unwrap();
    std::fs::write(&placed, &bytes).unwrap();
    let message = world.download(&branch).unwrap_err();
    assert!(
        message.contains("to commit") && message.contains(NEWER),
        "{message}"
    );

    // No file for the split rule.
    let (world, _) = placed_by_hand(&bytes);
    let validation = spec(
        PINNED,
        haares_data::SplitRule::RowModulo {
            pattern: "**/validation-*.parquet".into(),
            shards: 1,
            modulo: 10,
        },
    );
    let placed = root(&world, &validation).join("data/validation-0.parquet");
    std::fs::write(&placed, &bytes).unwrap();
    let message = world.download(&validation).unwrap_err();
    assert!(
        message.contains("no file of the listing") && message.contains("not used"),
        "{message}"
    );

    // Fewer files than the rule reads (OpenWebText's rule reads the first 30).
    let (world, spec) = placed_by_hand(&bytes);
    let three = self::spec(PINNED, first(3));
    let message = world.download(&three).unwrap_err();
    assert!(
        message.contains("holds 1 files") && message.contains("first 3"),
        "{message}"
    );
    assert_eq!(world.fetched(), Vec::<String>::new());
    // The same files with the hub out of reach are used as they are (nothing was downloaded).
    let hand = download(&spec, &unreachable(world.cache.path())).unwrap();
    assert_eq!(std::fs::read(hand.join(TRAIN)).unwrap(), bytes);
}

#[test]
fn a_failing_content_request_names_its_status() {
    let world = World::with(&[(TRAIN, shard(0, 4))]);
    let spec = spec(PINNED, first(1));
    world.hub.fail(TRAIN, Fault::ContentStatus(502));
    let message = world.download(&spec).unwrap_err();
    assert!(
        message.contains("502") && message.contains(TRAIN),
        "{message}"
    );
    world.hub.heal();
    world.download(&spec).unwrap();
}

#[test]
fn the_listing_gives_sizes_and_hashes_only_when_asked_with_blobs() {
    let world = World::with(&[(TRAIN, shard(0, 4))]);
    let listing = |query: &str| -> serde_json::Value {
        let url = format!(
            "{}/api/datasets/{REPO}/revision/{PINNED}{query}",
            world.hub.endpoint()
        );
        ureq::get(&url).call().unwrap().into_json().unwrap()
    };
    let bare = listing("");
    assert_eq!(bare["siblings"][0]["rfilename"], TRAIN);
    assert!(bare["siblings"][0].get("size").is_none(), "{bare}");
    assert!(bare["siblings"][0].get("lfs").is_none(), "{bare}");
    let full = listing("?blobs=true");
    assert!(full["siblings"][0]["size"].is_u64(), "{full}");
    assert!(full["siblings"][0]["lfs"]["sha256"].is_string(), "{full}");
}

#[test]
fn a_file_stored_in_git_is_served_at_once_and_checked_by_its_size() {
    let bytes = shard(0, 4);
    let world = World::with(&[]);
    world.hub.publish_in_git(REPO, PINNED, TRAIN, bytes.clone());
    let spec = spec(PINNED, first(1));
    let resolve = format!(
        "{}/datasets/{REPO}/resolve/{PINNED}/{TRAIN}",
        world.hub.endpoint()
    );
    let agent = ureq::AgentBuilder::new().redirects(0).build();
    let answer = agent.get(&resolve).call().unwrap();
    assert_eq!(answer.status(), 200);
    assert!(answer.header("ETag").is_some());
    assert!(answer.header("X-Linked-Etag").is_none() && answer.header("X-Linked-Size").is_none());
    assert_ne!(
        answer.header("ETag").unwrap().trim_matches('"'),
        sha256_hex(&bytes)
    );

    let root = world.download(&spec).unwrap();
    assert_eq!(std::fs::read(root.join(TRAIN)).unwrap(), bytes);
    assert!(
        !world
            .hub
            .requests()
            .iter()
            .any(|r| r.url.starts_with("/cdn/"))
    );
}

#[test]
fn a_renamed_repository_is_followed_through_a_relative_location() {
    let bytes = shard(0, 4);
    let hub = LocalHub::start().unwrap();
    hub.publish(
        "new-owner/corpus",
        PINNED,
        vec![(TRAIN.into(), bytes.clone())],
    );
    hub.rename(REPO, "new-owner/corpus");
    let resolve = format!(
        "{}/datasets/{REPO}/resolve/{PINNED}/{TRAIN}",
        hub.endpoint()
    );
    let agent = ureq::AgentBuilder::new().redirects(0).build();
    let answer = agent.get(&resolve).call().unwrap();
    assert_eq!(answer.status(), 307);
    assert!(answer.header("Location").unwrap().starts_with('/'));

    let world = World {
        hub,
        cache: tempfile::tempdir().unwrap(),
    };
    let root = world.download(&spec(PINNED, first(1))).unwrap();
    assert_eq!(std::fs::read(root.join(TRAIN)).unwrap(), bytes);
}
