//! The AWS shared files (`~/.aws/credentials`, `~/.aws/config`): what the AWS CLI and SDKs
//! read when the environment does not say. Only the settings a client of S3 needs are taken:
//! keys, session token, region, endpoint; credentials come whole from one source
//! ([`settings`]).

use std::collections::HashMap;
use std::path::PathBuf;

use fastensor_core::{Error, ErrorKind, Result};

/// The settings of one profile, by their `aws_*` configuration name
/// (`aws_access_key_id`, `aws_secret_access_key`, `aws_session_token`, `aws_region`,
/// `aws_endpoint_url`).
pub(crate) type Settings = HashMap<String, String>;

/// Profile settings that get credentials in ways fastensor does not support (assumed roles,
/// SSO, a credential process, a web identity named in the profile).
const UNSUPPORTED: &[&str] = &[
    "role_arn",
    "source_profile",
    "credential_source",
    "credential_process",
    "web_identity_token_file",
    "sso_session",
    "sso_start_url",
    "sso_account_id",
    "sso_role_name",
];

/// The client's settings, by their `aws_*` configuration name, as the AWS tools take
/// credentials: from the **first source that is set**, whole, never key by key across
/// sources:
///
/// 1. the environment's `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` (with its
///    `AWS_SESSION_TOKEN`, if any);
/// 2. a web identity of the environment (`AWS_WEB_IDENTITY_TOKEN_FILE` and `AWS_ROLE_ARN`,
///    which the client reads itself);
/// 3. the profile (`AWS_PROFILE`, or `default`) of the AWS shared files: its static keys
///    (with its own session token). A profile that gets credentials another way
///    (`role_arn`, `source_profile`, `credential_source`, `credential_process`,
///    `web_identity_token_file`, `sso_*`) is [`ErrorKind::Unsupported`] naming the profile
///    and the setting, rather than another identity used silently;
/// 4. otherwise, the container's or the instance's role (the client asks for them).
///
/// One of a key pair without the other (in the environment or the profile) is
/// [`ErrorKind::InvalidInput`] naming what is missing. Region and endpoint: the environment
/// (`AWS_REGION`, `AWS_DEFAULT_REGION`, `AWS_ENDPOINT_URL`, `AWS_ENDPOINT_URL_S3`), else the
/// profile's; the other `AWS_*` settings the client takes come from the environment.
pub(crate) fn settings(var: &dyn Fn(&str) -> Option<String>) -> Result<Vec<(String, String)>> {
    let (profile_name, profile) = profile_of(var);
    let mut out: Vec<(String, String)> = Vec::new();
    // Region and endpoint: the profile's, then the environment's over them.
    for name in ["aws_region", "aws_endpoint_url"] {
        if let Some(v) = profile.get(name) {
            out.push((name.into(), v.clone()));
        }
    }
    for name in [
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "AWS_ENDPOINT",
        "AWS_ALLOW_HTTP",
        "AWS_SKIP_SIGNATURE",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    ] {
        if let Some(v) = var(name) {
            let key = match name {
                "AWS_ENDPOINT_URL_S3" => "aws_endpoint_url".to_string(),
                _ => name.to_ascii_lowercase(),
            };
            out.push((key, v));
        }
    }
    let pair = |id: Option<String>, secret: Option<String>, id_name: &str, secret_name: &str| match (
        id, secret,
    ) {
        (Some(id), Some(secret)) => Ok(Some((id, secret))),
        (None, None) => Ok(None),
        (Some(_), None) => Err(missing(secret_name, id_name)),
        (None, Some(_)) => Err(missing(id_name, secret_name)),
    };
    // 1. The environment's keys.
    if let Some((id, secret)) = pair(
        var("AWS_ACCESS_KEY_ID"),
        var("AWS_SECRET_ACCESS_KEY"),
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
    )? {
        push_keys(&mut out, id, secret, var("AWS_SESSION_TOKEN"));
        return Ok(out);
    }
    // 2. A web identity of the environment: the client's own provider takes it.
    if var("AWS_WEB_IDENTITY_TOKEN_FILE").is_some() && var("AWS_ROLE_ARN").is_some() {
        return Ok(out);
    }
    // 3. The profile.
    if let Some(setting) = UNSUPPORTED.iter().find(|s| profile.contains_key(**s)) {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "AWS profile `{profile_name}` gets its credentials through `{setting}`, which \
                 fastensor does not support: give keys in the environment \
                 (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN) or in the profile"
            ),
        ));
    }
    let profile_id = format!("aws_access_key_id of AWS profile `{profile_name}`");
    let profile_secret = format!("aws_secret_access_key of AWS profile `{profile_name}`");
    if let Some((id, secret)) = pair(
        profile.get("aws_access_key_id").cloned(),
        profile.get("aws_secret_access_key").cloned(),
        &profile_id,
        &profile_secret,
    )? {
        push_keys(
            &mut out,
            id,
            secret,
            profile.get("aws_session_token").cloned(),
        );
    }
    // 4. Nothing set: the client asks the container or the instance.
    Ok(out)
}

fn push_keys(out: &mut Vec<(String, String)>, id: String, secret: String, token: Option<String>) {
    out.push(("aws_access_key_id".into(), id));
    out.push(("aws_secret_access_key".into(), secret));
    if let Some(token) = token {
        out.push(("aws_session_token".into(), token));
    }
}

fn missing(what: &str, given: &str) -> Error {
    Error::new(
        ErrorKind::InvalidInput,
        format!("{given} is set without {what}: credentials are taken whole from one source"),
    )
}

/// The name of profile `AWS_PROFILE` (or `default`) and its settings from the credentials
/// file (`AWS_SHARED_CREDENTIALS_FILE`, or `~/.aws/credentials`) over the config file
/// (`AWS_CONFIG_FILE`, or `~/.aws/config`), by their names in the files (`region` and
/// `endpoint_url` as `aws_region` and `aws_endpoint_url`). Missing or unreadable files give
/// nothing.
fn profile_of(var: &dyn Fn(&str) -> Option<String>) -> (String, Settings) {
    let profile = var("AWS_PROFILE").unwrap_or_else(|| "default".into());
    let home = var("HOME").map(PathBuf::from);
    let file = |name: &str, default: &str| {
        var(name)
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".aws").join(default)))
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    };
    let config_section = if profile == "default" {
        "default".to_string()
    } else {
        format!("profile {profile}")
    };
    let mut settings = section(&file("AWS_CONFIG_FILE", "config"), &config_section);
    settings.extend(section(
        &file("AWS_SHARED_CREDENTIALS_FILE", "credentials"),
        &profile,
    ));
    let settings = settings
        .into_iter()
        .map(|(k, v)| {
            let name = match k.as_str() {
                "region" => "aws_region".into(),
                "endpoint_url" => "aws_endpoint_url".into(),
                _ => k,
            };
            (name, v)
        })
        .collect();
    (profile, settings)
}

/// The settings of profile `AWS_PROFILE` (or `default`) a client of S3 takes (keys, session
/// token, region, endpoint), as [`profile_of`] reads them.
#[cfg(test)]
pub(crate) fn from_files(var: &dyn Fn(&str) -> Option<String>) -> Settings {
    profile_of(var)
        .1
        .into_iter()
        .filter(|(k, _)| {
            matches!(
                k.as_str(),
                "aws_access_key_id"
                    | "aws_secret_access_key"
                    | "aws_session_token"
                    | "aws_region"
                    | "aws_endpoint_url"
            )
        })
        .collect()
}

/// The `key = value` lines of section `[name]` of an INI file (the AWS files' format).
fn section(text: &str, name: &str) -> HashMap<String, String> {
    let mut inside = false;
    let mut out = HashMap::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(header) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = header.trim() == name;
        } else if inside {
            if let Some((k, v)) = line.split_once('=') {
                out.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn a_named_profile_takes_keys_from_credentials_and_region_from_config() {
        let dir = tempfile::tempdir().unwrap();
        let creds = dir.path().join("credentials");
        let config = dir.path().join("config");
        std::fs::write(
            &creds,
            "[default]\naws_access_key_id = D\n[work]\naws_access_key_id = W\n\
             aws_secret_access_key=S\n",
        )
        .unwrap();
        std::fs::write(
            &config,
            "[default]\nregion = eu-west-1\n[profile work]\n# a comment\nregion = us-west-2\n\
             endpoint_url = http://127.0.0.1:9000\noutput = json\n",
        )
        .unwrap();
        let vars = |name: &str| match name {
            "AWS_PROFILE" => Some("work".to_string()),
            "AWS_SHARED_CREDENTIALS_FILE" => Some(creds.display().to_string()),
            "AWS_CONFIG_FILE" => Some(config.display().to_string()),
            _ => None,
        };
        let s = from_files(&vars);
        assert_eq!(s["aws_access_key_id"], "W");
        assert_eq!(s["aws_secret_access_key"], "S");
        assert_eq!(s["aws_region"], "us-west-2");
        assert_eq!(s["aws_endpoint_url"], "http://127.0.0.1:9000");
        assert!(!s.contains_key("output"));
    }

    #[test]
    fn missing_files_give_nothing() {
        let vars = |name: &str| (name == "HOME").then(|| "/nonexistent-home".to_string());
        assert!(from_files(&vars).is_empty());
    }

    /// Variables from `pairs`, the shared files written in `dir`.
    fn env<'a>(
        dir: &'a Path,
        pairs: &'a [(&'a str, &'a str)],
    ) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| match name {
            "AWS_SHARED_CREDENTIALS_FILE" => Some(dir.join("credentials").display().to_string()),
            "AWS_CONFIG_FILE" => Some(dir.join("config").display().to_string()),
            _ => pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string()),
        }
    }

    fn get<'a>(s: &'a [(String, String)], key: &str) -> Option<&'a str> {
        s.iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn credentials_come_whole_from_the_first_source_set() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("credentials"),
            "[default]\naws_access_key_id = FILE\naws_secret_access_key = FS\n\
             aws_session_token = FILE-TOKEN\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("config"), "[default]\nregion = eu-west-1\n").unwrap();
        // The environment's keys, without the file's token.
        let s = settings(&env(
            dir.path(),
            &[
                ("AWS_ACCESS_KEY_ID", "ENV"),
                ("AWS_SECRET_ACCESS_KEY", "ES"),
            ],
        ))
        .unwrap();
        assert_eq!(get(&s, "aws_access_key_id"), Some("ENV"));
        assert_eq!(get(&s, "aws_secret_access_key"), Some("ES"));
        assert_eq!(get(&s, "aws_session_token"), None);
        assert_eq!(get(&s, "aws_region"), Some("eu-west-1"));
        // The profile's keys and token, whole.
        let s = settings(&env(dir.path(), &[])).unwrap();
        assert_eq!(get(&s, "aws_access_key_id"), Some("FILE"));
        assert_eq!(get(&s, "aws_session_token"), Some("FILE-TOKEN"));
        // A web identity of the environment comes before the profile's keys.
        let s = settings(&env(
            dir.path(),
            &[
                ("AWS_WEB_IDENTITY_TOKEN_FILE", "/var/token"),
                ("AWS_ROLE_ARN", "arn:aws:iam::1:role/r"),
            ],
        ))
        .unwrap();
        assert_eq!(get(&s, "aws_access_key_id"), None);
        assert_eq!(get(&s, "aws_session_token"), None);
        // Half a key pair is an error, not the other half from elsewhere.
        let e = settings(&env(dir.path(), &[("AWS_ACCESS_KEY_ID", "ENV")])).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(e.to_string().contains("AWS_SECRET_ACCESS_KEY"), "{e}");
    }

    #[test]
    fn profiles_of_kinds_not_supported_are_refused_naming_the_profile() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("credentials"),
            "[default]\naws_access_key_id = D\naws_secret_access_key = DS\n",
        )
        .unwrap();
        for (setting, line) in [
            (
                "role_arn",
                "role_arn = arn:aws:iam::1:role/r\nsource_profile = default",
            ),
            ("credential_process", "credential_process = /bin/creds"),
            ("sso_session", "sso_session = corp\nsso_account_id = 1"),
            (
                "web_identity_token_file",
                "web_identity_token_file = /var/t",
            ),
        ] {
            std::fs::write(
                dir.path().join("config"),
                format!("[profile work]\n{line}\nregion = us-west-2\n"),
            )
            .unwrap();
            let e = settings(&env(dir.path(), &[("AWS_PROFILE", "work")])).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Unsupported, "{setting}: {e}");
            assert!(e.to_string().contains("`work`"), "{e}");
            assert!(e.to_string().contains(setting), "{e}");
            // The environment's keys come first: no profile is read for credentials.
            let s = settings(&env(
                dir.path(),
                &[
                    ("AWS_PROFILE", "work"),
                    ("AWS_ACCESS_KEY_ID", "E"),
                    ("AWS_SECRET_ACCESS_KEY", "S"),
                ],
            ))
            .unwrap();
            assert_eq!(get(&s, "aws_access_key_id"), Some("E"));
        }
    }
}
