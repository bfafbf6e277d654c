//! A save replaces the name it is given: a symbolic link there is replaced by the new
//! file, never followed, so a save cannot be steered onto another file by a link (such as
//! one that another user planted in a sticky, world-writable directory like `/tmp`).

mod support;

use fastensor::Engine;
use fastensor_testkit::skip::is_root;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use support::{names_in, save_small, value_at};

/// A new directory `name` in `dir`, and a symbolic link `link` in `dir` to it.
fn linked_dir(dir: &Path, name: &str, link: &str) -> (PathBuf, PathBuf) {
    let (target, link) = (dir.join(name), dir.join(link));
    std::fs::create_dir(&target).unwrap();
    std::os::unix::fs::symlink(&target, &link).unwrap();
    (target, link)
}

fn is_regular_file(path: &Path) -> bool {
    std::fs::symlink_metadata(path)
        .unwrap()
        .file_type()
        .is_file()
}

#[test]
fn a_save_through_a_symlink_replaces_the_link_and_leaves_its_target() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real.safetensors");
    let link = dir.path().join("link.safetensors");
    save_small(&real, 1).unwrap();
    let before = std::fs::read(&real).unwrap();
    std::os::unix::fs::symlink("real.safetensors", &link).unwrap();

    save_small(&link, 2).unwrap();
    assert!(is_regular_file(&link), "the link is now the new file");
    assert_eq!(value_at(&link), 2);
    assert_eq!(std::fs::read(&real).unwrap(), before, "the target changed");
    assert_eq!(
        names_in(dir.path()),
        ["link.safetensors", "real.safetensors"]
    );

    // Profiles and reports go through the same path.
    let text = dir.path().join("text.toml");
    let profile = dir.path().join("profile.toml");
    std::fs::write(&text, "kept").unwrap();
    std::os::unix::fs::symlink(&text, &profile).unwrap();
    fastensor::atomic::write(&profile, b"new").unwrap();
    assert!(is_regular_file(&profile));
    assert_eq!(std::fs::read(&profile).unwrap(), b"new");
    assert_eq!(std::fs::read(&text).unwrap(), b"kept");
    let engine = Engine::new().unwrap();
    std::fs::remove_file(&profile).unwrap();
    std::os::unix::fs::symlink(&text, &profile).unwrap();
    engine.save_profile_to(&profile).unwrap();
    assert!(is_regular_file(&profile));
    assert_eq!(std::fs::read(&text).unwrap(), b"kept");
}

#[test]
fn a_save_to_a_dangling_symlink_replaces_the_link_and_creates_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("dangling.safetensors");
    let missing = dir.path().join("sub").join("missing.safetensors");
    std::os::unix::fs::symlink(&missing, &link).unwrap();
    save_small(&link, 3).unwrap();
    assert!(is_regular_file(&link));
    assert_eq!(value_at(&link), 3);
    assert!(!missing.exists());
    assert_eq!(names_in(dir.path()), ["dangling.safetensors"]);
}

#[test]
fn a_save_to_a_symlink_to_a_directory_replaces_the_link_and_leaves_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let (sub, link) = linked_dir(dir.path(), "sub", "to-dir.safetensors");
    save_small(&link, 4).unwrap();
    assert!(is_regular_file(&link));
    assert!(std::fs::symlink_metadata(&sub).unwrap().is_dir());
    assert!(names_in(&sub).is_empty());
}

#[test]
fn a_symlinked_directory_on_the_way_is_followed() {
    let dir = tempfile::tempdir().unwrap();
    let (real, via) = linked_dir(dir.path(), "real", "via");
    save_small(&via.join("c.safetensors"), 5).unwrap();
    assert!(is_regular_file(&real.join("c.safetensors")));
    assert_eq!(value_at(&real.join("c.safetensors")), 5);
    assert!(std::fs::symlink_metadata(&via)
        .unwrap()
        .file_type()
        .is_symlink());
}

/// The attack of the security review: as root, a save to a path in a sticky,
/// world-writable directory where another user planted a symbolic link to a root-only
/// file elsewhere. The file must not change; the link is replaced by a new file of root's.
#[test]
fn a_planted_symlink_in_a_sticky_directory_does_not_redirect_a_save_as_root() {
    if !is_root() {
        fastensor_testkit::skip!("needs root (lchown to another user)");
    }
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, b"root only").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let planted = shared.join("model.safetensors");
    std::os::unix::fs::symlink(&secret, &planted).unwrap();
    std::os::unix::fs::lchown(&planted, Some(65534), Some(65534)).unwrap();
    let profile = shared.join("profile.toml");
    std::os::unix::fs::symlink(&secret, &profile).unwrap();
    std::os::unix::fs::lchown(&profile, Some(65534), Some(65534)).unwrap();

    save_small(&planted, 6).unwrap();
    fastensor::atomic::write(&profile, b"profile").unwrap();

    assert_eq!(std::fs::read(&secret).unwrap(), b"root only");
    let meta = std::fs::metadata(&secret).unwrap();
    assert_eq!((meta.mode() & 0o7777, meta.uid()), (0o600, 0));
    for path in [&planted, &profile] {
        let m = std::fs::symlink_metadata(path).unwrap();
        assert!(
            m.file_type().is_file(),
            "{} is not the new file",
            path.display()
        );
        // Nothing is taken over from the link: the new file is root's.
        assert_eq!((m.uid(), m.gid()), (0, 0), "{}", path.display());
    }
    assert_eq!(value_at(&planted), 6);
    assert_eq!(std::fs::read(&profile).unwrap(), b"profile");
}
