//! Settings of the Google Cloud Storage (`gs://`) and Azure Blob Storage (`az://`) clients,
//! taken as each cloud's own tools take them. (S3's come from [`crate::profile`].)
//!
//! - **GCS**: a service account file (`GOOGLE_SERVICE_ACCOUNT`,
//!   `GOOGLE_SERVICE_ACCOUNT_PATH`) or key (`GOOGLE_SERVICE_ACCOUNT_KEY`, the JSON itself),
//!   else the application default credentials (`GOOGLE_APPLICATION_CREDENTIALS`, else
//!   gcloud's file, else the instance's metadata server), which the client reads itself.
//!   `STORAGE_EMULATOR_HOST` (`http://host:port`, or `host:port`), as Google's client
//!   libraries take it, sends every request there, unauthenticated.
//! - **Azure**: `AZURE_STORAGE_CONNECTION_STRING` (the form the Azure tools and the
//!   Azurite emulator give: `AccountName`, `AccountKey`, `SharedAccessSignature`,
//!   `BlobEndpoint`, `UseDevelopmentStorage=true`), then the `AZURE_STORAGE_*` and
//!   `AZURE_*` variables over it (`AZURE_STORAGE_ACCOUNT_NAME`, `AZURE_STORAGE_ACCOUNT_KEY`,
//!   `AZURE_STORAGE_SAS_TOKEN`, `AZURE_STORAGE_TOKEN`, `AZURE_STORAGE_ENDPOINT`,
//!   `AZURE_CLIENT_ID`, `AZURE_CLIENT_SECRET`, `AZURE_TENANT_ID`,
//!   `AZURE_FEDERATED_TOKEN_FILE`, `AZURE_STORAGE_USE_EMULATOR`); without keys the client
//!   asks the instance's managed identity.

use fastensor_core::{Error, ErrorKind, Result};
use object_store::azure::AzureConfigKey;
use object_store::gcp::GoogleConfigKey;
use std::str::FromStr;

/// The account and key of Azure's storage emulator (Azurite), public by design.
const EMULATOR_ACCOUNT: &str = "devstoreaccount1";
const EMULATOR_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// A client's settings, and whether its endpoint is plain `http://`.
pub(crate) struct Settings<K> {
    pub(crate) keys: Vec<(K, String)>,
    pub(crate) http: bool,
}

/// The GCS client's settings (see the module documentation).
pub(crate) fn gcs(var: &dyn Fn(&str) -> Option<String>) -> Result<Settings<GoogleConfigKey>> {
    let mut keys = Vec::new();
    set_from(
        var,
        &[
            "GOOGLE_SERVICE_ACCOUNT",
            "GOOGLE_SERVICE_ACCOUNT_PATH",
            "GOOGLE_SERVICE_ACCOUNT_KEY",
            "GOOGLE_APPLICATION_CREDENTIALS",
        ],
        &mut keys,
    )?;
    let mut http = false;
    if let Some(host) = var("STORAGE_EMULATOR_HOST").filter(|v| !v.trim().is_empty()) {
        let host = host.trim().trim_end_matches('/');
        let base = if host.contains("://") {
            host.to_string()
        } else {
            format!("http://{host}")
        };
        http = base.starts_with("http://");
        // The client's way to another endpoint: a service account key that names it and
        // turns authentication off (no credential is sent to an emulator).
        let key = format!(
            r#"{{"private_key":"","private_key_id":"","client_email":"","disable_oauth":true,"gcs_base_url":{}}}"#,
            json_string(&base)
        );
        keys.retain(|(k, _)| !matches!(k, GoogleConfigKey::ServiceAccount));
        keys.push((GoogleConfigKey::ServiceAccountKey, key));
    }
    Ok(Settings { keys, http })
}

/// The Azure client's settings (see the module documentation). A connection string that
/// does not parse is [`ErrorKind::InvalidInput`] naming the variable.
pub(crate) fn azure(var: &dyn Fn(&str) -> Option<String>) -> Result<Settings<AzureConfigKey>> {
    let mut keys: Vec<(AzureConfigKey, String)> = Vec::new();
    if let Some(cs) = var("AZURE_STORAGE_CONNECTION_STRING").filter(|v| !v.trim().is_empty()) {
        keys = connection_string(&cs)?;
    }
    set_from(
        var,
        &[
            "AZURE_STORAGE_ACCOUNT_NAME",
            "AZURE_STORAGE_ACCOUNT_KEY",
            "AZURE_STORAGE_ACCESS_KEY",
            "AZURE_STORAGE_SAS_KEY",
            "AZURE_STORAGE_SAS_TOKEN",
            "AZURE_STORAGE_TOKEN",
            "AZURE_STORAGE_ENDPOINT",
            "AZURE_STORAGE_USE_EMULATOR",
            "AZURE_CLIENT_ID",
            "AZURE_CLIENT_SECRET",
            "AZURE_TENANT_ID",
            "AZURE_AUTHORITY_HOST",
            "AZURE_FEDERATED_TOKEN_FILE",
            "AZURE_MSI_ENDPOINT",
            "AZURE_USE_AZURE_CLI",
            "AZURE_SKIP_SIGNATURE",
        ],
        &mut keys,
    )?;
    let http = keys
        .iter()
        .any(|(k, v)| *k == AzureConfigKey::Endpoint && v.starts_with("http://"));
    Ok(Settings { keys, http })
}

/// Each variable of `names` that is set, as the client's setting of that name (lowercased),
/// in place of an earlier value of the same setting in `keys`.
fn set_from<K: FromStr + PartialEq>(
    var: &dyn Fn(&str) -> Option<String>,
    names: &[&str],
    keys: &mut Vec<(K, String)>,
) -> Result<()>
where
    K::Err: std::fmt::Display,
{
    for name in names {
        if let Some(v) = var(name).filter(|v| !v.is_empty()) {
            let key = K::from_str(&name.to_ascii_lowercase())
                .map_err(|e| Error::new(ErrorKind::InvalidInput, format!("{name}: {e}")))?;
            keys.retain(|(k, _)| *k != key);
            keys.push((key, v));
        }
    }
    Ok(())
}

/// The container and the account of an `abfs://` URL's authority
/// (`container@account.dfs.core.windows.net`, or any host whose first label is the
/// account); `None` when it names no container or no account.
pub(crate) fn abfs_authority(authority: &str) -> Option<(&str, &str)> {
    let (container, host) = authority.split_once('@')?;
    let account = host.split('.').next()?;
    (!container.is_empty() && !account.is_empty()).then_some((container, account))
}

/// An Azure storage connection string's settings.
fn connection_string(cs: &str) -> Result<Vec<(AzureConfigKey, String)>> {
    let bad = |why: String| {
        Error::new(
            ErrorKind::InvalidInput,
            format!("AZURE_STORAGE_CONNECTION_STRING: {why}"),
        )
    };
    let mut keys = Vec::new();
    let mut protocol = "https".to_string();
    let mut suffix = "core.windows.net".to_string();
    let mut account = None;
    let mut endpoint = None;
    for part in cs.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, value) = part
            .split_once('=')
            .ok_or_else(|| bad(format!("`{part}` is not Name=value")))?;
        match name {
            "UseDevelopmentStorage" if value.eq_ignore_ascii_case("true") => {
                account = Some(EMULATOR_ACCOUNT.to_string());
                keys.push((AzureConfigKey::AccessKey, EMULATOR_KEY.to_string()));
                endpoint = Some(format!("http://127.0.0.1:10000/{EMULATOR_ACCOUNT}"));
            }
            "AccountName" => account = Some(value.to_string()),
            "AccountKey" => keys.push((AzureConfigKey::AccessKey, value.to_string())),
            "SharedAccessSignature" => keys.push((AzureConfigKey::SasKey, value.to_string())),
            "BlobEndpoint" => endpoint = Some(value.trim_end_matches('/').to_string()),
            "DefaultEndpointsProtocol" => protocol = value.to_string(),
            "EndpointSuffix" => suffix = value.to_string(),
            // Endpoints of the other services (queues, tables, files), and settings the
            // blob client does not need.
            _ => {}
        }
    }
    let account = account.ok_or_else(|| bad("no AccountName".into()))?;
    let endpoint = endpoint.unwrap_or_else(|| format!("{protocol}://{account}.blob.{suffix}"));
    keys.push((AzureConfigKey::AccountName, account));
    keys.push((AzureConfigKey::Endpoint, endpoint));
    Ok(keys)
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
    }

    #[test]
    fn an_azurite_connection_string_names_the_account_key_and_endpoint() {
        let cs = format!(
            "DefaultEndpointsProtocol=http;AccountName={EMULATOR_ACCOUNT};AccountKey={EMULATOR_KEY};\
             BlobEndpoint=http://127.0.0.1:41234/{EMULATOR_ACCOUNT};QueueEndpoint=http://x;"
        );
        let s = azure(&vars(&[("AZURE_STORAGE_CONNECTION_STRING", &cs)])).unwrap();
        assert!(s.http);
        let get = |k: AzureConfigKey| {
            s.keys
                .iter()
                .find(|(x, _)| *x == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get(AzureConfigKey::AccountName), Some(EMULATOR_ACCOUNT));
        assert_eq!(get(AzureConfigKey::AccessKey), Some(EMULATOR_KEY));
        assert_eq!(
            get(AzureConfigKey::Endpoint),
            Some("http://127.0.0.1:41234/devstoreaccount1")
        );
        // A variable of its own overrides the string's.
        let s = azure(&vars(&[
            ("AZURE_STORAGE_CONNECTION_STRING", &cs),
            ("AZURE_STORAGE_ACCOUNT_NAME", "other"),
        ]))
        .unwrap();
        let names: Vec<_> = s
            .keys
            .iter()
            .filter(|(k, _)| *k == AzureConfigKey::AccountName)
            .collect();
        assert_eq!(names.len(), 1);
        assert_eq!(names[0].1, "other");
        // The cloud's own endpoint when none is given.
        let s = azure(&vars(&[(
            "AZURE_STORAGE_CONNECTION_STRING",
            "AccountName=acct;AccountKey=a2V5",
        )]))
        .unwrap();
        assert!(!s.http);
        assert!(s.keys.contains(&(
            AzureConfigKey::Endpoint,
            "https://acct.blob.core.windows.net".into()
        )));
    }

    #[test]
    fn an_abfs_authority_names_the_container_and_the_account() {
        assert_eq!(
            abfs_authority("ckpt@acct.dfs.core.windows.net"),
            Some(("ckpt", "acct"))
        );
        for bad in ["ckpt", "@acct.dfs.core.windows.net", "ckpt@"] {
            assert_eq!(abfs_authority(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_bad_connection_string_is_named() {
        for cs in ["AccountKey=k", "garbage"] {
            // (Settings has no Debug: it holds secrets.)
            let Err(e) = azure(&vars(&[("AZURE_STORAGE_CONNECTION_STRING", cs)])) else {
                panic!("{cs:?} was taken");
            };
            assert_eq!(e.kind(), ErrorKind::InvalidInput);
            assert!(
                e.to_string().contains("AZURE_STORAGE_CONNECTION_STRING"),
                "{e}"
            );
        }
    }

    #[test]
    fn the_gcs_emulator_host_becomes_an_unauthenticated_base_url() {
        for host in ["127.0.0.1:4443", "http://127.0.0.1:4443/"] {
            let s = gcs(&vars(&[("STORAGE_EMULATOR_HOST", host)])).unwrap();
            assert!(s.http);
            let (k, v) = s.keys.last().unwrap();
            assert_eq!(*k, GoogleConfigKey::ServiceAccountKey);
            assert!(
                v.contains(r#""gcs_base_url":"http://127.0.0.1:4443""#),
                "{v}"
            );
            assert!(v.contains(r#""disable_oauth":true"#), "{v}");
        }
        let s = gcs(&vars(&[("GOOGLE_APPLICATION_CREDENTIALS", "/x.json")])).unwrap();
        assert!(!s.http);
        assert_eq!(
            s.keys,
            vec![(
                GoogleConfigKey::ApplicationCredentials,
                "/x.json".to_string()
            )]
        );
    }
}
