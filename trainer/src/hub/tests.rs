//! The pure parts; resolution against a real cache layout is tested in `tests/tests/hub.rs`
//! (its fixture writes the layout huggingface_hub writes, and checks it with huggingface_hub).

use super::*;

#[test]
fn repo_ids_are_owner_slash_name_and_never_climb() {
    for id in ["Qwen/Qwen3-8B", "HuggingFaceH4/ultrachat_200k", "a/b", "org.x/model_1.5-b"] {
        assert!(is_repo_id(id), "{id}");
    }
    for id in
        ["gpt2", "tiny", "", "/x", "x/", "a/b/c", "../x", "a/..", "a/.hidden", "-a/b", "a/b c", "a\\b/c", "a/x..y"]
    {
        assert!(!is_repo_id(id), "{id}");
    }
}

#[test]
fn revisions_that_could_leave_refs_are_refused() {
    assert_eq!(checked_revision(None).unwrap(), "main");
    for ok in ["main", "v1.0", "refs/pr/1", "0123456789abcdef0123456789abcdef01234567"] {
        assert_eq!(checked_revision(Some(ok)).unwrap(), ok);
    }
    for bad in ["", "/etc", "../x", "a/../../b", "a//b", "./x"] {
        assert!(matches!(checked_revision(Some(bad)), Err(HubError::BadRevision(_))), "{bad}");
    }
}

#[test]
fn the_fetch_command_names_kind_and_revision_only_when_needed() {
    assert_eq!(fetch_command("Qwen/Qwen3-8B", RepoKind::Model, "main"), "mindxtrain fetch Qwen/Qwen3-8B");
    assert_eq!(
        fetch_command("HuggingFaceH4/ultrachat_200k", RepoKind::Dataset, "v2"),
        "mindxtrain fetch HuggingFaceH4/ultrachat_200k --dataset --revision v2"
    );
}

#[test]
fn sources_name_their_commit_in_uris() {
    let s = HubSource { repo: "o/n".into(), revision: "main".into(), commit: "ab".repeat(20) };
    assert_eq!(s.uri(RepoKind::Model), format!("hf://o/n@{}", "ab".repeat(20)));
    assert_eq!(s.uri(RepoKind::Dataset), format!("hf://datasets/o/n@{}", "ab".repeat(20)));
}

#[test]
fn a_bad_id_is_refused_before_the_cache_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let cache = HubCache::at(dir.path()).unwrap();
    assert_eq!(cache.dir(), dir.path());
    let err = cache.resolve("../../etc", RepoKind::Model, None).unwrap_err();
    assert!(matches!(err, HubError::BadRepoId(_)), "{err}");
}

#[test]
fn an_empty_cache_names_the_ref_it_looked_for_and_the_fetch_command() {
    let dir = tempfile::tempdir().unwrap();
    let cache = HubCache::at(dir.path()).unwrap();
    let err = cache.resolve("Qwen/Qwen3-8B", RepoKind::Model, Some("v1")).unwrap_err().to_string();
    let looked = dir.path().join("models--Qwen--Qwen3-8B/refs/v1");
    assert!(err.contains(&looked.display().to_string()), "{err}");
    assert!(err.contains("mindxtrain fetch Qwen/Qwen3-8B --revision v1"), "{err}");
    let sha = "0123456789abcdef0123456789abcdef01234567";
    let err = cache.resolve("o/ds", RepoKind::Dataset, Some(sha)).unwrap_err().to_string();
    assert!(err.contains(&dir.path().join("datasets--o--ds/snapshots").join(sha).display().to_string()), "{err}");
    assert!(err.contains("--dataset"), "{err}");
}
