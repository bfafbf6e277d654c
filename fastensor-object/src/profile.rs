//! The AWS shared files (`~/.aws/credentials`, `~/.aws/config`): what the AWS CLI and SDKs
//! read when the environment does not say. Only the settings a client of S3 needs are taken:
//! keys, session token, region, endpoint.

use std::collections::HashMap;
use std::path::PathBuf;

/// The settings of one profile, by their `aws_*` configuration name
/// (`aws_access_key_id`, `aws_secret_access_key`, `aws_session_token`, `aws_region`,
/// `aws_endpoint_url`).
pub(crate) type Settings = HashMap<String, String>;

/// The settings of profile `AWS_PROFILE` (or `default`) from the credentials file
/// (`AWS_SHARED_CREDENTIALS_FILE`, or `~/.aws/credentials`) over the config file
/// (`AWS_CONFIG_FILE`, or `~/.aws/config`). Missing or unreadable files give nothing.
pub(crate) fn from_files(var: &dyn Fn(&str) -> Option<String>) -> Settings {
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
    settings
        .into_iter()
        .filter_map(|(k, v)| {
            let name = match k.as_str() {
                "aws_access_key_id" | "aws_secret_access_key" | "aws_session_token" => k,
                "region" => "aws_region".into(),
                "endpoint_url" => "aws_endpoint_url".into(),
                _ => return None,
            };
            Some((name, v))
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
}
